//! The `Date` field of responses (RFC 9110 §6.6.1), formatted once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The length of an IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub const LEN: usize = 29;

thread_local! {
    static CACHED: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
}

/// Now, as an IMF-fixdate.
pub fn now() -> [u8; LEN] {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != second {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == LEN {
                text.copy_from_slice(formatted.as_bytes());
                *at = second;
            }
        }
        *text
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_date_is_an_imf_fixdate() {
        let date = super::now();
        let text = std::str::from_utf8(&date).unwrap();
        assert!(httpdate::parse_http_date(text).is_ok(), "{text}");
        assert!(text.ends_with(" GMT"));
    }
}
