//! nginx's value syntaxes (times `30s`, `1h 30m`, `500ms`, `60`; sizes `10m`, `8k`)
//! read, and written back in sluicegate's units.

use std::time::Duration;

/// A field value made of nginx variables (`https://$host$request_uri`) in sluicegate's
/// words (`variables`): `$remote_addr` is `$client_ip` (`set_real_ip_from` became
/// `trusted_proxies`), `$host`, `$request_uri` and `$scheme` are the same. `None` when it
/// uses another variable.
pub fn field_value(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => braced.split_once('}')?,
            None => {
                let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        let ours = match name {
            "remote_addr" => "client_ip",
            "host" | "request_uri" | "scheme" => name,
            _ => return None,
        };
        let glued = next.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&if glued { format!("${{{ours}}}") } else { format!("${ours}") });
        rest = next;
    }
    out.push_str(rest);
    Some(out)
}

/// An nginx time (`ngx_parse_time`): parts `N` + unit `ms`, `s`, `m`, `h`, `d`, `w`,
/// `M` (30 days), `y` (365 days), summed; a bare number is seconds.
pub fn time(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid time {text:?}");
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| bad());
    }
    let mut rest = text.trim();
    let mut total: u64 = 0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let count: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (ms, unit_len) = match rest.as_bytes() {
            [b'm', b's', ..] => (1, 2),
            [b's', ..] => (1000, 1),
            [b'm', ..] => (60_000, 1),
            [b'h', ..] => (3_600_000, 1),
            [b'd', ..] => (86_400_000, 1),
            [b'w', ..] => (7 * 86_400_000, 1),
            [b'M', ..] => (30 * 86_400_000, 1),
            [b'y', ..] => (365 * 86_400_000, 1),
            _ => return Err(bad()),
        };
        total = count.checked_mul(ms).and_then(|part| total.checked_add(part)).ok_or_else(bad)?;
        rest = rest[unit_len..].trim_start();
    }
    Ok(Duration::from_millis(total))
}

/// An nginx size (`ngx_parse_size`, `ngx_parse_offset`): bytes, or `k`, `m`, `g`
/// (either case) times 1024.
pub fn size(text: &str) -> Result<u64, String> {
    let bad = || format!("invalid size {text:?}");
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'k' | b'K') => (&text[..text.len() - 1], 10),
        Some(b'm' | b'M') => (&text[..text.len() - 1], 20),
        Some(b'g' | b'G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

/// A duration as sluicegate writes it: the largest unit that keeps it exact.
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, len) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)] {
        if ms > 0 && ms.is_multiple_of(len) {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

/// A size as sluicegate writes it: `g`, `m` or `k` when exact, else bytes.
pub fn size_text(bytes: u64) -> String {
    for (unit, shift) in [("g", 30), ("m", 20), ("k", 10)] {
        if bytes > 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_times_read_in_every_unit_and_come_back_exact() {
        let t = |s: &str| time(s).map(duration_text);
        assert_eq!(t("60").unwrap(), "1m");
        assert_eq!(t("75s").unwrap(), "75s");
        assert_eq!(t("1h 30m").unwrap(), "90m");
        assert_eq!(t("500ms").unwrap(), "500ms");
        assert_eq!(t("1w").unwrap(), "7d");
        assert_eq!(t("0").unwrap(), "0ms");
        assert!(t("5x").is_err() && t("").is_err() && t("s").is_err());
    }

    #[test]
    fn nginx_sizes_read_in_every_unit_and_come_back_exact() {
        assert_eq!(size("10m").unwrap(), 10 << 20);
        assert_eq!(size("8K").unwrap(), 8192);
        assert_eq!(size("1500").unwrap(), 1500);
        assert!(size("1t").is_err() && size("").is_err());
        assert_eq!(size_text(1 << 20), "1m");
        assert_eq!(size_text(1500), "1500");
        assert_eq!(size_text(0), "0");
    }
}
