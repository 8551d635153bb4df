//! gRPC as the proxy sees it (the gRPC over HTTP/2 protocol, `PROTOCOL-HTTP2.md` of
//! grpc/grpc): which requests are gRPC calls, the deadline a call carries
//! (`grpc-timeout`), its status codes, and the status a response ends with
//! (`grpc-status`, in the trailers or in a trailers-only head). A leaf: it imports no
//! other module, so the wire, the proxy and the upstreams read it alike.

use std::time::Duration;

use http::HeaderMap;

/// A gRPC status code (the ones sluicegate answers with, and any a server sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code(pub u8);

impl Code {
    pub const OK: Code = Code(0);
    pub const UNKNOWN: Code = Code(2);
    pub const INVALID_ARGUMENT: Code = Code(3);
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    pub const PERMISSION_DENIED: Code = Code(7);
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    pub const UNIMPLEMENTED: Code = Code(12);
    pub const INTERNAL: Code = Code(13);
    pub const UNAVAILABLE: Code = Code(14);
    pub const UNAUTHENTICATED: Code = Code(16);

    /// The code's name, as the gRPC status codes document names it.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        NAMES.get(usize::from(self.0)).copied().unwrap_or("UNKNOWN")
    }

    /// The code named `name` (`RESOURCE_EXHAUSTED`, any case).
    pub fn named(name: &str) -> Option<Code> {
        (0..=16u8).map(Code).find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// The code a `grpc-status` value gives (`None`: not a decimal number below 256).
    pub fn parse(value: &[u8]) -> Option<Code> {
        std::str::from_utf8(value).ok()?.parse().ok().map(Code)
    }

    /// The code that stands for an HTTP status where a gRPC response has none (gRPC's
    /// `http-grpc-status-mapping.md`).
    pub fn of_http(status: u16) -> Code {
        match status {
            400 => Code::INTERNAL,
            401 => Code::UNAUTHENTICATED,
            403 => Code::PERMISSION_DENIED,
            404 => Code::UNIMPLEMENTED,
            429 | 502..=504 => Code::UNAVAILABLE,
            // Beyond gRPC's table: the request was too large, or too slow to arrive.
            413 | 414 | 431 => Code::RESOURCE_EXHAUSTED,
            408 => Code::DEADLINE_EXCEEDED,
            _ => Code::UNKNOWN,
        }
    }
}

/// What a gRPC call that ended with `code` is to a limit's `count:` list: a number
/// past every HTTP status, which the list holds for each code in `count_grpc`.
pub fn counted_status(code: Code) -> u16 {
    1000 + u16::from(code.0)
}

/// Whether a request with this `content-type` is a gRPC call: `application/grpc`, or
/// `application/grpc+proto` and the like (`application/grpc-web` is another protocol).
pub fn is_grpc(content_type: Option<&[u8]>) -> bool {
    let Some(value) = content_type else { return false };
    let media = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
    let Some(rest) = media.get(..16).filter(|p| p.eq_ignore_ascii_case(b"application/grpc")).map(|_| &media[16..])
    else {
        return false;
    };
    rest.is_empty() || rest[0] == b'+'
}

/// The deadline a `grpc-timeout` value gives: at most 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`); `None` for anything else.
pub fn timeout(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` of `fields` (a response's trailers, or a trailers-only head).
pub fn status(fields: &HeaderMap) -> Option<Code> {
    fields.get("grpc-status").and_then(|v| Code::parse(v.as_bytes()))
}

/// `text` as a `grpc-message` value: percent-encoded as the protocol asks (bytes
/// outside printable ASCII, and `%`).
pub fn message(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_told_apart() {
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC; charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/grpcx", false),
            ("application/json", false),
        ] {
            assert_eq!(is_grpc(Some(value.as_bytes())), grpc, "{value}");
        }
        assert!(!is_grpc(None));
    }

    #[test]
    fn grpc_timeouts_are_read_by_their_unit() {
        assert_eq!(timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout(b"99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in [&b""[..], b"S", b"123456789S", b"1s", b"-1S", b"1.5S"] {
            assert_eq!(timeout(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn codes_have_their_names_and_messages_are_percent_encoded() {
        assert_eq!(Code::RESOURCE_EXHAUSTED.name(), "RESOURCE_EXHAUSTED");
        assert_eq!(Code::named("unavailable"), Some(Code::UNAVAILABLE));
        assert_eq!(Code::named("nope"), None);
        assert_eq!(Code::parse(b"14"), Some(Code::UNAVAILABLE));
        assert_eq!(message("50% off, café"), "50%25 off, caf%C3%A9");
    }
}
