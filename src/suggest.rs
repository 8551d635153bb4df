//! "Did you mean …?": the known name a misspelt one most likely stands for, and the
//! words that list a few known names when none is close.

/// Known names listed in a message when none is close; past this many, the message says
/// where they are instead of flooding the line.
pub const LISTED: usize = 8;

/// The name among `known` that `name` most likely misspells, if one is close enough to
/// be a typo rather than another word: the same name in another case, the same words
/// (split at `_` and `-`) in another order, or the nearest by Damerau-Levenshtein
/// distance (a swap of two neighbours counts as one edit) when that distance is small for
/// the name's length: one edit up to 4 characters (`rate` is not a typo of `path`), two
/// up to 8 (`adres` of `address`), a third of the length past that (rustc's rule for its
/// own suggestions), and never all of it (`b` is not "corrected" into `a`). Ties go to the
/// first name in alphabetical order, so the answer does not depend on the order of `known`.
pub fn closest<'k>(name: &str, known: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    let mut known: Vec<&str> = known.into_iter().filter(|k| *k != name).collect();
    known.sort_unstable();
    if let Some(same) = known.iter().find(|k| k.eq_ignore_ascii_case(name)) {
        return Some(same);
    }
    let words = |s: &str| {
        let mut words: Vec<String> = s.split(['_', '-']).map(str::to_ascii_lowercase).collect();
        words.sort_unstable();
        words
    };
    if name.contains(['_', '-']) {
        let mine = words(name);
        if let Some(reordered) = known.iter().find(|k| words(k) == mine) {
            return Some(reordered);
        }
    }
    let length = name.chars().count();
    let bound = (length / 3).max(if length >= 5 { 2 } else { 1 });
    known
        .into_iter()
        // The distance is at least the difference in length: a name far longer than any
        // known one (500 000 characters of it) costs no distance computed.
        .filter(|k| k.chars().count().abs_diff(length) <= bound)
        .map(|k| (strsim::damerau_levenshtein(name, k), k))
        .filter(|&(distance, _)| distance <= bound && distance < length)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, k)| k)
}

/// `` `a` ``, `` `a` or `b` ``, `` `a`, `b` or `c` ``: names in backquotes, in the order given.
pub fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => format!("`{one}`"),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(|n| format!("`{n}`")).collect();
            format!("{} or `{last}`", init.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_name() {
        let fields = ["timeout", "connect_timeout", "servers", "address", "key", "rate", "retries", "tls"];
        for (typo, meant) in [
            ("timout", "timeout"),
            ("tiemout", "timeout"),
            ("Timeout", "timeout"),
            ("timeout_connect", "connect_timeout"),
            ("connect_timout", "connect_timeout"),
            ("server", "servers"),
            ("kye", "key"),
            ("rat", "rate"),
            ("retires", "retries"),
            ("tsl", "tls"),
            ("adres", "address"),
            ("sevrers", "servers"),
        ] {
            assert_eq!(closest(typo, fields), Some(meant), "{typo}");
        }
    }

    #[test]
    fn other_words_find_nothing() {
        let fields = ["timeout", "key", "rate", "to", "a"];
        for other in ["path", "burst", "ip", "b", "zz", "timeout_in_seconds", "rates_per_key", ""] {
            assert_eq!(closest(other, fields), None, "{other}");
        }
        // A name is never its own suggestion.
        assert_eq!(closest("rate", ["rate"]), None);
        assert_eq!(closest(&"k".repeat(500_000), ["key"]), None);
    }

    #[test]
    fn ties_go_to_the_first_name_alphabetically() {
        assert_eq!(closest("per_ipx", ["per_ipz", "per_ipy"]), Some("per_ipy"));
    }

    #[test]
    fn names_are_listed_with_or() {
        assert_eq!(one_of(&[]), "");
        assert_eq!(one_of(&["a"]), "`a`");
        assert_eq!(one_of(&["a", "b"]), "`a` or `b`");
        assert_eq!(one_of(&["a", "b", "c"]), "`a`, `b` or `c`");
    }
}
