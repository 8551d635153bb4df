//! Tenant limits (`limit_from`): a limit whose count each key may have its own of, set
//! without a reload, by the operator (`PUT /overrides/NAME?...`, kept) or per request by a
//! source the proxy trusts (a field a trusted proxy or an auth gateway in front sets, or a
//! claim of the verified token), always within `[min, max]`.
//!
//! The count is the number the limit is written with: a rate's requests per its
//! interval (`rate: 10r/s`, a token bucket's `refill`; the burst stays as many requests),
//! a window's `limit` (an amount on a money budget), a concurrency limit's requests in
//! flight.

use super::charge::MICROS;
use super::key::KeyPart;

/// A limit's `limit_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantFrom {
    /// Where a request may say its key's count: `header:NAME` (honoured only from a peer
    /// in `trusted_proxies`) or `jwt:CLAIM` (a verified token's); `None`: only the
    /// operator sets counts.
    pub source: Option<KeyPart>,
    /// The bounds every count is clamped to, in the limit's units (micro-units of money).
    pub min: u64,
    pub max: u64,
    /// The limit counts money: a count is written as an amount (`25.50`).
    pub money: bool,
}

/// How a count given for a key fared against the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    Within(u64),
    /// Outside `[min, max]`: the bound it was clamped to.
    Clamped(u64),
}

impl Fit {
    pub fn count(self) -> u64 {
        match self {
            Fit::Within(n) | Fit::Clamped(n) => n,
        }
    }
}

impl TenantFrom {
    /// `count` within the bounds.
    pub fn fit(&self, count: u64) -> Fit {
        match count.clamp(self.min, self.max) {
            n if n == count => Fit::Within(n),
            n => Fit::Clamped(n),
        }
    }

    /// The count written `text` (a whole number, or an amount of money on a money
    /// budget), in the limit's units; `None`: not a count.
    pub fn parse(&self, text: &[u8]) -> Option<u64> {
        let text = std::str::from_utf8(text).ok()?.trim();
        if self.money { amount(text) } else { whole(text) }
    }
}

fn whole(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// An amount of money (`25`, `25.5`, `0.000015`: at most six decimals) in micro-units,
/// read exactly (no floating point).
pub fn amount(text: &str) -> Option<u64> {
    let (units, decimals) = text.split_once('.').unwrap_or((text, ""));
    if decimals.len() > 6 || (decimals.is_empty() && text.ends_with('.')) {
        return None;
    }
    let units = whole(units)?;
    let fraction = if decimals.is_empty() { 0 } else { whole(decimals)? * 10u64.pow(6 - decimals.len() as u32) };
    units.checked_mul(MICROS)?.checked_add(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(min: u64, max: u64, money: bool) -> TenantFrom {
        TenantFrom { source: None, min, max, money }
    }

    #[test]
    fn a_count_is_a_whole_number_and_is_clamped_to_the_bounds() {
        let t = from(5, 100, false);
        assert_eq!(t.parse(b"50"), Some(50));
        assert_eq!(t.parse(b" 50 "), Some(50));
        for bad in [&b""[..], b"-1", b"1.5", b"1e3", b"abc", b"99999999999999999999999"] {
            assert_eq!(t.parse(bad), None, "{bad:?}");
        }
        assert_eq!(t.fit(50), Fit::Within(50));
        assert_eq!(t.fit(1), Fit::Clamped(5));
        assert_eq!(t.fit(1000), Fit::Clamped(100));
    }

    #[test]
    fn a_money_count_is_an_amount_read_exactly() {
        let t = from(1, 100 * MICROS, true);
        assert_eq!(t.parse(b"25"), Some(25 * MICROS));
        assert_eq!(t.parse(b"25.5"), Some(25_500_000));
        assert_eq!(t.parse(b"0.000015"), Some(15));
        assert_eq!(t.parse(b"0.1234567"), None, "a seventh decimal");
        assert_eq!(t.parse(b"25."), None);
        assert_eq!(t.parse(b".5"), None);
    }
}
