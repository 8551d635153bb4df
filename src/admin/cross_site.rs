//! Cross-site calls refused. A web page the operator happens to visit can make the
//! browser send requests to the admin listener (`POST` to `127.0.0.1:9901` from a form or
//! `fetch`): the browser sends them without asking, and only hides the answer. So a call
//! that changes state (any method but the safe ones, RFC 9110 §9.2.1) is refused when
//! the browser says it comes from another site: a `Sec-Fetch-Site` other than
//! `same-origin` or `none` (typed or bookmarked), an `Origin` that is not this listener's
//! own, or a body of a type a plain HTML form can send without a preflight (the Fetch
//! standard's CORS-safelisted types). Clients other than browsers (curl, `sluicegate
//! reload`) send none of these and are not affected.

use http::header::{self, HeaderName};

use crate::wire::head::{Known, RequestHead, text};

const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// The body types an HTML form sends (`enctype`), which need no CORS preflight.
const FORM_TYPES: [&str; 3] = ["application/x-www-form-urlencoded", "multipart/form-data", "text/plain"];

/// Why `head`, a call that changes state, is refused as coming from another site, if it
/// is.
pub fn refusal(head: &RequestHead<'_>) -> Option<String> {
    let fields = head.fields;
    let shown = |value: &[u8]| String::from_utf8_lossy(value).into_owned();
    if let Some(site) = fields
        .get_all(&SEC_FETCH_SITE)
        .find(|site| !site.eq_ignore_ascii_case(b"same-origin") && !site.eq_ignore_ascii_case(b"none"))
    {
        return Some(format!("Sec-Fetch-Site: {}; only same-origin calls may change state", shown(site)));
    }
    let host = fields.first_of(Known::Host).or(head.authority.map(str::as_bytes)).and_then(text);
    let own = host.map(|host| format!("http://{host}"));
    if let Some(origin) = fields
        .get_all(&header::ORIGIN)
        .find(|origin| own.as_deref().is_none_or(|own| !origin.eq_ignore_ascii_case(own.as_bytes())))
    {
        let own = own.as_deref().unwrap_or("none: the request names no host");
        return Some(format!("Origin {} is not this admin listener's ({own})", shown(origin)));
    }
    if let Some(form) = fields.get_all(&header::CONTENT_TYPE).find_map(|value| {
        let media = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        FORM_TYPES.into_iter().find(|form| media.eq_ignore_ascii_case(form.as_bytes()))
    }) {
        return Some(format!("a body of type {form} is what a plain HTML form sends; send none, or application/json"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::head::Fields;

    fn refused(fields: &[(&str, &str)]) -> Option<String> {
        let mut request = http::Request::post("/reload");
        for (name, value) in fields {
            request = request.header(*name, *value);
        }
        let request = request.body(()).unwrap();
        let head = RequestHead {
            method: request.method(),
            target: "/reload",
            version: http::Version::HTTP_11,
            authority: None,
            fields: Fields::from(request.headers()),
        };
        refusal(&head)
    }

    #[test]
    fn a_call_from_this_origin_or_from_no_browser_passes() {
        assert_eq!(refused(&[("host", "127.0.0.1:9901")]), None, "curl, sluicegate reload");
        let page = [("host", "127.0.0.1:9901"), ("origin", "http://127.0.0.1:9901"), ("sec-fetch-site", "same-origin")];
        assert_eq!(refused(&page), None, "the dashboard's own fetch");
        assert_eq!(
            refused(&[("host", "localhost:9901"), ("sec-fetch-site", "none")]),
            None,
            "typed in the address bar"
        );
        assert_eq!(refused(&[("host", "a"), ("content-type", "application/json")]), None);
    }

    #[test]
    fn a_call_another_site_makes_the_browser_send_is_refused_with_its_reason() {
        let host = ("host", "127.0.0.1:9901");
        assert_eq!(
            refused(&[host, ("sec-fetch-site", "cross-site")]).unwrap(),
            "Sec-Fetch-Site: cross-site; only same-origin calls may change state"
        );
        assert!(refused(&[host, ("sec-fetch-site", "same-site")]).is_some(), "another port of the same host");
        assert_eq!(
            refused(&[host, ("origin", "http://evil.example")]).unwrap(),
            "Origin http://evil.example is not this admin listener's (http://127.0.0.1:9901)"
        );
        assert!(refused(&[host, ("origin", "null")]).is_some(), "a sandboxed page or a file");
        assert!(refused(&[host, ("origin", "https://127.0.0.1:9901")]).is_some(), "another scheme");
        assert!(refused(&[("origin", "http://127.0.0.1:9901")]).is_some(), "no host to compare with");
        for form in ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "Text/Plain;charset=utf-8"]
        {
            let why = refused(&[host, ("content-type", form)]).unwrap();
            assert!(why.contains("is what a plain HTML form sends"), "{form}: {why}");
        }
    }
}
