//! The counts keys were given of a limit with `limit_from` (`policy::tenant`): those the
//! operator set (`PUT /overrides/NAME?...`), by key, and what became of every count a
//! request met. Kept across a reload by the limit's name, as its state is.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::policy::key::{KeyHash, KeyPart, KeySource};
use crate::policy::tenant::{Fit, TenantFrom};

/// A limit's `limit_from` with the counts given its keys.
pub(crate) struct Tenant {
    pub(crate) from: TenantFrom,
    pub(crate) set: std::sync::Arc<Tenants>,
}

impl Tenant {
    /// `count` as the limit's local state decides with it, where `share` instances share
    /// it (a global limit's local twin): a window's or a concurrency limit's count is
    /// divided (rounded up); a rate's is not, its interval is the twin's, already
    /// multiplied (`limit::shared`).
    pub(crate) fn local(count: u64, share: u64, rate: bool) -> u64 {
        if rate { count } else { count.div_ceil(share.max(1)).max(1) }
    }
}

/// A count the operator gave a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The key as every surface writes it (`KeyText`).
    pub key: String,
    /// Its parts as a lookup names them (`header:x-api-key=acme`): what `DELETE` and a
    /// restart (`persist`) name it by.
    pub parts: String,
    /// As given (clamped to the limit's bounds when used, which a reload may change).
    pub count: u64,
}

/// The counts the operator gave, by key (hashed as the limit's tables hash it), and the
/// tally of counts met.
#[derive(Default)]
pub struct Tenants {
    given: RwLock<HashMap<u64, Given>>,
    /// Some count is given: a request of a key with none takes no lock.
    any: AtomicBool,
    pub(crate) tally: Tally,
}

/// What became of the counts requests met, since start.
#[derive(Default)]
pub struct Tally {
    /// Requests decided with a key's own count (the operator's or their source's).
    pub applied: AtomicU64,
    /// Of them, with a count outside `[min, max]`, clamped.
    pub clamped: AtomicU64,
    /// Requests whose source said no count (`abc`, `-1`, or the field twice: which one
    /// the trusted proxy set cannot be told): decided with the limit's.
    pub invalid: AtomicU64,
    /// Requests that said a count in the field from a peer not in `trusted_proxies`:
    /// ignored, the limit's count decided (a client may not raise its own limit).
    pub untrusted: AtomicU64,
}

/// Where a key's count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    /// The operator (`PUT /overrides`).
    Operator,
    /// A trusted proxy's field.
    Header,
    /// The verified token's claim.
    Jwt,
}

impl Whence {
    pub fn as_str(self) -> &'static str {
        match self {
            Whence::Operator => "operator",
            Whence::Header => "header",
            Whence::Jwt => "jwt",
        }
    }
}

/// The count a key decides with, where it came from, and whether it was clamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub count: u64,
    pub whence: Whence,
    pub clamped: bool,
}

impl Tenants {
    /// The count the operator gave `key`, if any.
    #[inline]
    pub fn given(&self, KeyHash(key): KeyHash) -> Option<u64> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.given.read().unwrap_or_else(|p| p.into_inner()).get(&key).map(|g| g.count)
    }

    /// Gives `key` its own count (replacing one given before).
    pub fn give(&self, KeyHash(key): KeyHash, given: Given) {
        let mut map = self.given.write().unwrap_or_else(|p| p.into_inner());
        map.insert(key, given);
        self.any.store(true, Ordering::Release);
    }

    /// Takes back the count given `key`; whether there was one.
    pub fn take_back(&self, KeyHash(key): KeyHash) -> bool {
        let mut map = self.given.write().unwrap_or_else(|p| p.into_inner());
        let had = map.remove(&key).is_some();
        self.any.store(!map.is_empty(), Ordering::Release);
        had
    }

    /// Every count given, in the order of their keys' parts.
    pub fn list(&self) -> Vec<Given> {
        let mut all: Vec<Given> = self.given.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        all.sort_by(|a, b| a.parts.cmp(&b.parts));
        all
    }

    /// How many keys have a count the operator gave.
    pub fn given_keys(&self) -> usize {
        self.given.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The count `key` (its request `src`) decides with under `from`, if its own: the
    /// operator's first, else what the source says (a field only from a trusted peer),
    /// within the bounds. `counting`: counted in `tally` (a preview counts nothing).
    pub fn count(&self, from: &TenantFrom, key: KeyHash, src: &KeySource<'_>, counting: bool) -> Option<Counted> {
        let tally = |counter: &AtomicU64| {
            if counting {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        };
        let (whence, given) = match self.given(key) {
            Some(count) => (Whence::Operator, count),
            None => {
                let part = from.source.as_ref()?;
                let value = part.value_in(src)?;
                let whence = match part {
                    KeyPart::Header(_) if !src.trusted_peer => {
                        tally(&self.tally.untrusted);
                        return None;
                    }
                    // A proxy that adds its field after the client's (rather than
                    // replacing it) would let the client's first value decide.
                    KeyPart::Header(name) if src.fields.get_all(name).nth(1).is_some() => {
                        tally(&self.tally.invalid);
                        return None;
                    }
                    KeyPart::Header(_) => Whence::Header,
                    _ => Whence::Jwt,
                };
                match from.parse(&value) {
                    Some(count) => (whence, count),
                    None => {
                        tally(&self.tally.invalid);
                        return None;
                    }
                }
            }
        };
        tally(&self.tally.applied);
        let fit = from.fit(given);
        let clamped = matches!(fit, Fit::Clamped(_));
        if clamped {
            tally(&self.tally.clamped);
        }
        Some(Counted { count: fit.count(), whence, clamped })
    }
}
