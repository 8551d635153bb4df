//! A limit's state as bytes and back: what `crate::persist` keeps in the state directory
//! for a limit with `persist: true`, written at shutdown and on a timer, read at start.
//!
//! Version 2 of the format, integers little-endian:
//!
//! ```text
//! magic "sgstate\0" | version u32 | secret check u64 (`KeySecret::check`) | written at u64 (ns)
//! | name (u32 length, UTF-8) | definition (u32 length, UTF-8: key and windows, `definition`)
//! | per window: kind u8 | count u32 | entries
//! | bans: count u32 | entries: key u64, state u64, name (u32 length, UTF-8)
//! | seal: HMAC-SHA-256 of everything before, keyed with the state directory's secret
//! ```
//!
//! The seal makes a file that was edited without the secret beside it (`keys.secret`,
//! readable by sluicegate's user only) a file refused: lowering a key's count or lifting
//! a ban by hand and recomputing a checksum no longer works. (Version 1 ended with a
//! plain SHA-256, which anyone could recompute; such a file is refused, and the limit
//! starts fresh once after an upgrade.)
//!
//! A file can hold no more than `Limiters::state_bound` bytes, derived from what the
//! limit can write (its windows and `max_keys`), and `crate::persist` refuses a larger
//! one before reading a byte of it.
//!
//! Entries are `key u64, state u64` (leaky bucket family, fixed window), `key, index u64,
//! counts u64` (sliding window) or `key, n u32, n × instant u64` (sliding log). Each table
//! holds at most the limit's `max_keys` keys, so a file holds at most that many entries
//! per window and as many bans. A state is taken back only from a file written for the
//! same limit (its name), with the same key and windows (its definition), keyed with the
//! same secret; entries whose state equals a fresh key's by now are skipped. Whatever the
//! bytes, reading them never panics: a file that does not decode in full is refused
//! whole, before any table changes.

use std::collections::VecDeque;

use ring::hmac;

use super::algorithm::Algorithm;
use super::secret::KeySecret;
use super::shards::MAX_SHARDS;
use super::{LimitId, Limiter, Limiters};
use crate::policy::key::KeyPart;

const MAGIC: &[u8; 8] = b"sgstate\0";
const VERSION: u32 = 2;
const SEAL_LEN: usize = 32;
/// The longest ban name (the key as `GET /bans` writes it) a file keeps; a longer one is
/// written as none (the ban is kept, and lifted by its digest), so that a file's size
/// is bounded by the limit's definition, not by what clients sent.
const MAX_BAN_NAME: usize = 512;

/// Why a state file was refused; the limit then starts fresh.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a sluicegate state file")]
    Foreign,
    #[error("state file format {0}, this version reads {VERSION}")]
    Version(u32),
    #[error("damaged, truncated, or edited without the state directory's secret (its seal does not match)")]
    Damaged,
    #[error("keyed with another secret (the state directory's keys.secret changed)")]
    OtherSecret,
    #[error("written for limit {0:?}")]
    OtherLimit(String),
    #[error("written for another key or windows ({written}; now {now})")]
    OtherDefinition { written: String, now: String },
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

/// What was taken back from a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Keys with state, counted in the window that holds the most.
    pub keys: usize,
    pub bans: usize,
    /// When the file was written (ns since the Unix epoch).
    pub written: u64,
}

/// One window's entries, decoded.
enum Entries {
    Pairs(Vec<(u64, u64)>),
    Triples(Vec<(u64, [u64; 2])>),
    Logs(Vec<(u64, VecDeque<u64>)>),
}

const PAIRS: u8 = 1;
const TRIPLES: u8 = 2;
const LOGS: u8 = 3;

impl Limiters {
    /// The state of `limit` at `now`, as its file holds it.
    pub fn snapshot(&self, limit: LimitId, now: u64) -> Vec<u8> {
        let limiter = &self.limits[limit];
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.secret.check().to_le_bytes());
        out.extend_from_slice(&now.to_le_bytes());
        text(&mut out, &limiter.id.0);
        text(&mut out, &definition(limiter));
        for window in limiter.windows.iter() {
            write_window(&mut out, window);
        }
        let bans = limiter.bans.as_ref().map(|b| b.entries()).unwrap_or_default();
        out.extend_from_slice(&count(bans.len()).to_le_bytes());
        for (key, state, name) in bans {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&state.to_le_bytes());
            text(&mut out, name.as_deref().filter(|name| name.len() <= MAX_BAN_NAME).unwrap_or(""));
        }
        let seal = hmac::sign(&seal_key(&self.secret), &out);
        out.extend_from_slice(seal.as_ref());
        out
    }

    /// The most bytes a file of `limit`'s state can hold: its header, each window's
    /// table full (every table holds at most `max_keys` keys, rounded up to a multiple of
    /// its shards; a sliding log at most `limit` instants a key) and as many bans, each
    /// with its longest name.
    pub fn state_bound(&self, limit: LimitId) -> u64 {
        let limiter = &self.limits[limit];
        let keys = (limiter.max_keys + MAX_SHARDS) as u64;
        let header = MAGIC.len() + 4 + 8 + 8 + 4 + limiter.id.0.len() + 4 + definition(limiter).len() + 4 + SEAL_LEN;
        let windows: u64 = (limiter.windows.iter())
            .map(|window| {
                let entry = match window {
                    Algorithm::SlidingWindow(..) => 24,
                    Algorithm::SlidingLog(a, _) => 12u64.saturating_add(a.limit().saturating_mul(8)),
                    _ => 16,
                };
                (1 + 4u64).saturating_add(keys.saturating_mul(entry))
            })
            .fold(0, u64::saturating_add);
        let bans = if limiter.bans.is_some() { keys.saturating_mul(8 + 8 + 4 + MAX_BAN_NAME as u64) } else { 0 };
        (header as u64).saturating_add(windows).saturating_add(bans)
    }

    /// Takes back the state of `limit` from `bytes`, a file `snapshot` wrote, at `now`:
    /// all of it or, if the file is refused, none.
    pub fn restore(&self, limit: LimitId, bytes: &[u8], now: u64) -> Result<Restored, Refusal> {
        let limiter = &self.limits[limit];
        let (written, windows, bans) = self.decode(limiter, bytes)?;
        let mut restored = Restored { written, ..Restored::default() };
        for (window, entries) in limiter.windows.iter().zip(windows) {
            restored.keys = restored.keys.max(take_window(window, entries, now));
        }
        if let Some(table) = &limiter.bans {
            restored.bans =
                bans.into_iter().filter(|(key, state, name)| table.restore(*key, *state, name, now)).count();
        }
        Ok(restored)
    }

    /// The windows' entries and the bans of `bytes`, checked against `limiter`.
    #[allow(clippy::type_complexity)]
    fn decode(&self, limiter: &Limiter, bytes: &[u8]) -> Result<(u64, Vec<Entries>, Vec<(u64, u64, String)>), Refusal> {
        let body = bytes.strip_prefix(MAGIC.as_slice()).ok_or(Refusal::Foreign)?;
        let mut r = Reader(body);
        let version = r.u32()?;
        if version != VERSION {
            return Err(Refusal::Version(version));
        }
        // Said apart from a broken seal: a file keyed with another secret is no attack.
        if r.u64()? != self.secret.check() {
            return Err(Refusal::OtherSecret);
        }
        let (content, seal) = bytes.split_at_checked(bytes.len().saturating_sub(SEAL_LEN)).ok_or(Refusal::Damaged)?;
        if content.len() < MAGIC.len() + 4 + 8 || hmac::verify(&seal_key(&self.secret), content, seal).is_err() {
            return Err(Refusal::Damaged);
        }
        let mut r = Reader(&content[MAGIC.len() + 4 + 8..]);
        let written = r.u64()?;
        let name = r.text()?;
        if name != *limiter.id.0 {
            return Err(Refusal::OtherLimit(name));
        }
        let (written_for, now) = (r.text()?, definition(limiter));
        if written_for != now {
            return Err(Refusal::OtherDefinition { written: written_for, now });
        }
        let windows = limiter.windows.iter().map(|w| read_window(&mut r, w)).collect::<Result<Vec<_>, _>>()?;
        let n = r.count(20)?;
        let bans = (0..n).map(|_| Ok((r.u64()?, r.u64()?, r.text()?))).collect::<Result<Vec<_>, Refusal>>()?;
        if !r.0.is_empty() {
            return Err(Refusal::Malformed("bytes after the last entry"));
        }
        Ok((written, windows, bans))
    }
}

/// The key of a file's seal: derived from the secret's digest key for this use alone, so
/// that no seal is ever a key part's digest (`KeyText`) or the other way round.
fn seal_key(secret: &KeySecret) -> hmac::Key {
    let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &secret.digest), b"sluicegate state file seal");
    hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())
}

/// What the state of `limiter` means: its key and each window's algorithm and what its
/// state depends on (as `Algorithm::adopt` judges it across a reload). A file written
/// for another definition holds states this limit would misread.
fn definition(limiter: &Limiter) -> String {
    let parts: Vec<String> = (limiter.key.0.iter())
        .map(|part| match part {
            KeyPart::Ip(prefix) => format!("ip/{}/{}", prefix.v4, prefix.v6),
            other => other.to_string(),
        })
        .collect();
    let windows: Vec<String> = limiter.windows.iter().map(Algorithm::meaning).collect();
    format!("key: {}; windows: {}", parts.join(" "), windows.join(", "))
}

fn count(n: usize) -> u32 {
    // A table holds at most `max_keys` keys, far below 2^32.
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn text(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&count(text.len()).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn write_window(out: &mut Vec<u8>, window: &Algorithm) {
    let mut entries = Vec::new();
    let mut n = 0usize;
    let kind = match window {
        Algorithm::LeakyBucket(_, t) | Algorithm::FixedWindow(_, t) => {
            t.each(|key, state| {
                n += 1;
                entries.extend_from_slice(&key.to_le_bytes());
                entries.extend_from_slice(&state.to_le_bytes());
            });
            PAIRS
        }
        Algorithm::SlidingWindow(_, t) => {
            t.each(|key, [index, counts]| {
                n += 1;
                for word in [key, index, counts] {
                    entries.extend_from_slice(&word.to_le_bytes());
                }
            });
            TRIPLES
        }
        Algorithm::SlidingLog(_, t) => {
            t.each(|key, log| {
                n += 1;
                entries.extend_from_slice(&key.to_le_bytes());
                entries.extend_from_slice(&count(log.len()).to_le_bytes());
                log.iter().for_each(|at| entries.extend_from_slice(&at.to_le_bytes()));
            });
            LOGS
        }
        // Requests in flight end with the process (the configuration refuses `persist`).
        Algorithm::Concurrency(..) => PAIRS,
    };
    out.push(kind);
    out.extend_from_slice(&count(n).to_le_bytes());
    out.extend_from_slice(&entries);
}

fn read_window(r: &mut Reader<'_>, window: &Algorithm) -> Result<Entries, Refusal> {
    let expected = match window {
        Algorithm::SlidingWindow(..) => TRIPLES,
        Algorithm::SlidingLog(..) => LOGS,
        _ => PAIRS,
    };
    if r.u8()? != expected {
        return Err(Refusal::Malformed("a window of another kind"));
    }
    Ok(match expected {
        PAIRS => {
            let n = r.count(16)?;
            Entries::Pairs((0..n).map(|_| Ok((r.u64()?, r.u64()?))).collect::<Result<_, Refusal>>()?)
        }
        TRIPLES => {
            let n = r.count(24)?;
            Entries::Triples((0..n).map(|_| Ok((r.u64()?, [r.u64()?, r.u64()?]))).collect::<Result<_, Refusal>>()?)
        }
        _ => {
            let n = r.count(12)?;
            let log = |r: &mut Reader<'_>| -> Result<(u64, VecDeque<u64>), Refusal> {
                let key = r.u64()?;
                let len = r.count(8)?;
                Ok((key, (0..len).map(|_| r.u64()).collect::<Result<_, _>>()?))
            };
            Entries::Logs((0..n).map(|_| log(r)).collect::<Result<_, _>>()?)
        }
    })
}

/// Puts `entries` into `window`'s table, but those whose state equals a fresh key's at
/// `now`; returns how many it took.
fn take_window(window: &Algorithm, entries: Entries, now: u64) -> usize {
    match (window, entries) {
        (Algorithm::LeakyBucket(a, t), Entries::Pairs(pairs)) => {
            let live: Vec<_> = pairs.into_iter().filter(|&(_, s)| !a.is_idle(s, now)).collect();
            for &(key, state) in &live {
                t.put(&mut t.lock(key), key, state, |s| a.is_idle(s, now), |s| s);
            }
            live.len()
        }
        (Algorithm::FixedWindow(a, t), Entries::Pairs(pairs)) => {
            let live: Vec<_> = pairs.into_iter().filter(|&(_, s)| !a.is_idle(s, now)).collect();
            for &(key, state) in &live {
                t.put(&mut t.lock(key), key, state, |s| a.is_idle(s, now), |s| s);
            }
            live.len()
        }
        (Algorithm::SlidingWindow(a, t), Entries::Triples(triples)) => {
            let live: Vec<_> = triples.into_iter().filter(|&(_, s)| !a.is_idle(s, now)).collect();
            for &(key, state) in &live {
                t.put(&mut t.lock(key), key, state, |s| a.is_idle(s, now), |[index, _]| index);
            }
            live.len()
        }
        (Algorithm::SlidingLog(a, t), Entries::Logs(logs)) => {
            logs.into_iter().filter(|(key, log)| t.restore(a, *key, log, now)).count()
        }
        _ => 0,
    }
}

/// Reads a file's fields; running out of bytes is `Malformed`.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Refusal> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(Refusal::Malformed("it ends inside an entry"))?;
        self.0 = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, Refusal> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, Refusal> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, Refusal> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    /// A count of items of at least `size` bytes each, which the bytes left can hold (so
    /// that no count makes a reader allocate more than the file's size).
    fn count(&mut self, size: usize) -> Result<usize, Refusal> {
        let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        if n.saturating_mul(size) > self.0.len() {
            return Err(Refusal::Malformed("a count larger than the file"));
        }
        Ok(n)
    }

    fn text(&mut self) -> Result<String, Refusal> {
        let len = self.count(1)?;
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(text.to_vec()).map_err(|_| Refusal::Malformed("a name that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Nanos};
    use crate::limit::secret::KeySecret;
    use crate::policy::key::KeyHash;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    const LIMITS: &str = "
  a_bucket: { key: ip, rate: 1r/m, burst: 5, ban: 1h }
  b_window: { key: ip, algorithm: fixed_window, limit: 5, window: 1h }
  c_sliding: { key: ip, algorithm: sliding_window, limit: 5, window: 1h }
  d_log: { key: ip, algorithm: sliding_log, limit: 5, window: 1h }
";

    fn limiters(limits: &str, secret: &KeySecret) -> Arc<Limiters> {
        let yaml = format!("listen: 127.0.0.1:0\nlimits:\n{limits}");
        let config = crate::config::parse(&yaml, "test").unwrap();
        Limiters::new(&config, ManualClock::new(Nanos(T0)).into(), secret.clone())
    }

    use std::sync::Arc;

    /// Admits a request of `key` in every window of `limit` at `now`, as the gate would.
    fn admit(l: &Limiters, limit: usize, key: u64, now: u64) {
        for window in l.limits[LimitId::from(limit)].windows.iter() {
            let mut held = window.lock(KeyHash(key));
            if let crate::limit::Verdict::Admit { state, .. } = held.decide(KeyHash(key), Nanos(now), 1) {
                held.store(KeyHash(key), state, Nanos(now), 1);
            }
        }
    }

    /// Every key's state in every window of `limit`, and its bans, sorted.
    fn tables(l: &Limiters, limit: usize) -> Vec<String> {
        let limiter = &l.limits[LimitId::from(limit)];
        let mut out = Vec::new();
        for window in limiter.windows.iter() {
            match window {
                Algorithm::LeakyBucket(_, t) | Algorithm::FixedWindow(_, t) => {
                    t.each(|k, s| out.push(format!("{k} {s}")))
                }
                Algorithm::SlidingWindow(_, t) => t.each(|k, s| out.push(format!("{k} {s:?}"))),
                Algorithm::SlidingLog(_, t) => t.each(|k, s| out.push(format!("{k} {s:?}"))),
                Algorithm::Concurrency(..) => {}
            }
        }
        if let Some(bans) = &limiter.bans {
            out.extend(bans.entries().into_iter().map(|(k, s, n)| format!("ban {k} {s} {n:?}")));
        }
        out.sort();
        out
    }

    fn filled(secret: &KeySecret) -> Arc<Limiters> {
        let l = limiters(LIMITS, secret);
        for limit in 0..4 {
            for key in 1..=20u64 {
                for n in 0..key % 4 {
                    admit(&l, limit, key, T0 + n * S);
                }
            }
        }
        let bans = l.limits[LimitId::from(0)].bans.as_ref().unwrap();
        bans.impose(&mut bans.lock(7), 7, T0);
        bans.name(7, "ip=192.0.2.7".into(), T0);
        l
    }

    #[test]
    fn every_algorithms_state_and_its_bans_read_back_as_written() {
        let secret = KeySecret::draw();
        let before = filled(&secret);
        let after = limiters(LIMITS, &secret);
        for limit in 0..4 {
            let file = before.snapshot(LimitId::from(limit), T0 + 10 * S);
            let restored = after.restore(LimitId::from(limit), &file, T0 + 10 * S).unwrap();
            assert_eq!(restored.keys, 15, "limit {limit}: keys 1..=20 but multiples of 4");
            assert_eq!(restored.written, T0 + 10 * S);
            assert_eq!(tables(&after, limit), tables(&before, limit), "limit {limit}");
        }
        let names = after.limits[LimitId::from(0)].bans.as_ref().unwrap().list(T0 + 10 * S);
        assert_eq!(names, [(7, Some("ip=192.0.2.7".into()), 3590 * S)]);
    }

    #[test]
    fn states_that_a_fresh_key_would_equal_by_now_are_not_taken() {
        let secret = KeySecret::draw();
        let before = filled(&secret);
        // Two hours on: every window has ended; the bucket (1 a minute, 6 at most) drained.
        let later = T0 + 7200 * S;
        let after = limiters(LIMITS, &secret);
        for limit in 1..4 {
            let file = before.snapshot(LimitId::from(limit), T0);
            assert_eq!(after.restore(LimitId::from(limit), &file, later).unwrap().keys, 0, "limit {limit}");
            assert!(tables(&after, limit).is_empty());
        }
        // The bucket has drained; the ban runs: kept.
        let r = after.restore(LimitId::from(0), &before.snapshot(LimitId::from(0), T0), T0 + 3000 * S).unwrap();
        assert_eq!((r.keys, r.bans), (0, 1));
    }

    #[test]
    fn a_file_of_another_limit_definition_or_secret_is_refused_whole() {
        let secret = KeySecret::draw();
        let file = filled(&secret).snapshot(LimitId::from(1), T0);
        let other_window =
            limiters("  b_window: { key: ip, algorithm: fixed_window, limit: 5, window: 2h }\n", &secret);
        let err = other_window.restore(LimitId::from(0), &file, T0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "written for another key or windows (key: ip/32/64; windows: fixed_window every 3600000000000ns; \
             now key: ip/32/64; windows: fixed_window every 7200000000000ns)"
        );
        let other_key = limiters(
            "  b_window: { key: \"header:x\", on_missing_key: skip, algorithm: fixed_window, limit: 5, window: 1h }\n",
            &secret,
        );
        assert!(matches!(other_key.restore(LimitId::from(0), &file, T0), Err(Refusal::OtherDefinition { .. })));
        let renamed = limiters("  renamed: { key: ip, algorithm: fixed_window, limit: 5, window: 1h }\n", &secret);
        assert_eq!(renamed.restore(LimitId::from(0), &file, T0), Err(Refusal::OtherLimit("b_window".into())));
        let rekeyed = limiters(LIMITS, &KeySecret::draw());
        assert_eq!(rekeyed.restore(LimitId::from(1), &file, T0), Err(Refusal::OtherSecret));
        assert!(tables(&other_window, 0).is_empty() && tables(&rekeyed, 1).is_empty());
        // A limit whose other fields changed (its limit, its status) reads it.
        let same =
            limiters("  b_window: { key: ip, algorithm: fixed_window, limit: 50, window: 1h, status: 503 }\n", &secret);
        assert_eq!(same.restore(LimitId::from(0), &file, T0).unwrap().keys, 15);
    }

    #[test]
    fn no_byte_sequence_panics_and_a_damaged_file_is_refused() {
        let secret = KeySecret::draw();
        let before = filled(&secret);
        let after = limiters(LIMITS, &secret);
        for limit in [0, 3] {
            let id = LimitId::from(limit);
            let file = before.snapshot(id, T0);
            for len in 0..file.len() {
                assert!(after.restore(id, &file[..len], T0).is_err(), "truncated to {len}");
            }
            for bit in 0..file.len() * 8 {
                let mut flipped = file.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(after.restore(id, &flipped, T0).is_err(), "bit {bit} flipped");
            }
            // With the seal made to match (by one who has the secret), the decoder itself
            // meets every damage.
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mut content = file[..file.len() - SEAL_LEN].to_vec();
                let at = (x as usize) % content.len();
                content[at] = (x >> 32) as u8;
                content.truncate(content.len() - (x >> 48) as usize % 3);
                let seal = hmac::sign(&seal_key(&secret), &content);
                content.extend_from_slice(seal.as_ref());
                let _ = after.restore(id, &content, T0);
            }
        }
        assert_eq!(after.restore(LimitId::from(0), b"", T0), Err(Refusal::Foreign));
        assert_eq!(after.restore(LimitId::from(0), b"{\"json\": true}", T0), Err(Refusal::Foreign));
    }

    /// Whoever can write the state directory but not read its secret cannot forge a
    /// state: a key's count set back and the file's SHA-256 recomputed (what version 1
    /// trusted) is refused whole.
    #[test]
    fn a_file_edited_without_the_secret_is_refused_whole() {
        use ring::digest::{SHA256, digest};
        let secret = KeySecret::draw();
        let before = filled(&secret);
        let after = limiters(LIMITS, &secret);
        let id = LimitId::from(1);
        let file = before.snapshot(id, T0);
        let mut content = file[..file.len() - SEAL_LEN].to_vec();
        // The fixed window's first entry: its state word set to 0 (a fresh count).
        let first_state = content.len() - 4 - 15 * 16 + 8;
        content[first_state..first_state + 8].copy_from_slice(&0u64.to_le_bytes());
        let mut forged = content.clone();
        forged.extend_from_slice(digest(&SHA256, &content).as_ref());
        assert_eq!(after.restore(id, &forged, T0), Err(Refusal::Damaged));
        let mut guessed = content.clone();
        let other = hmac::Key::new(hmac::HMAC_SHA256, &KeySecret::draw().digest);
        guessed.extend_from_slice(hmac::sign(&other, &content).as_ref());
        assert_eq!(after.restore(id, &guessed, T0), Err(Refusal::Damaged));
        assert!(tables(&after, 1).is_empty(), "nothing taken");
        // A version 1 file (its plain checksum) is refused by its version.
        let mut old = file.clone();
        old[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(after.restore(id, &old, T0), Err(Refusal::Version(1)));
    }

    #[test]
    fn a_full_table_writes_no_more_than_its_bound() {
        let secret = KeySecret::draw();
        let l = limiters(
            "  a: { key: ip, rate: 1r/m, burst: 5, ban: 1h, max_keys: 100 }\n  b: { key: ip, algorithm: sliding_log, limit: 3, window: 1h, max_keys: 100 }\n",
            &secret,
        );
        for key in 0..1_000u64 {
            for limit in 0..2 {
                for _ in 0..4 {
                    admit(&l, limit, key, T0 + key);
                }
            }
            l.limits[LimitId::from(0)].bans.as_ref().unwrap().name(key, "x".repeat(600), T0);
        }
        for limit in 0..2 {
            let id = LimitId::from(limit);
            let file = l.snapshot(id, T0 + 1_000);
            assert!(file.len() as u64 <= l.state_bound(id), "limit {limit}: {} > {}", file.len(), l.state_bound(id));
        }
        assert!(l.state_bound(LimitId::from(1)) < 10_000, "a small limit has a small bound");
    }
}
