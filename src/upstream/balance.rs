//! How a server is chosen among those an upstream may use now: each function takes the
//! servers' weights and an `eligible` filter (not taken out, not tried yet) and returns
//! an index. Health and bookkeeping live in `upstream`; here are only the choices.

use std::sync::Mutex;

use smallvec::SmallVec;

/// nginx's smooth weighted round robin: each pick adds every eligible server's weight
/// to its counter and takes the highest, which then gives back the sum. Weights 5, 1, 1
/// give `a a b a c a a`, not `a a a a a b c`.
pub struct SmoothRoundRobin {
    current: Mutex<Box<[i64]>>,
}

impl SmoothRoundRobin {
    pub fn new(servers: usize) -> Self {
        SmoothRoundRobin { current: Mutex::new(vec![0; servers].into()) }
    }

    pub fn pick(&self, weights: &[u32], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        // A poisoned lock only means another pick panicked midway: the counters are
        // still numbers, and any numbers keep the rotation going.
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let mut best: Option<usize> = None;
        let mut total = 0;
        for (i, &w) in weights.iter().enumerate().filter(|&(i, _)| eligible(i)) {
            current[i] += i64::from(w);
            total += i64::from(w);
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        current[best] -= total;
        Some(best)
    }
}

/// The eligible servers with the fewest requests in progress per unit of weight; ties
/// (an idle upstream) go round robin by weight, as nginx's `least_conn` does.
pub fn least_conn(
    rr: &SmoothRoundRobin,
    weights: &[u32],
    loads: &[usize],
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    // load/weight compared as load_a * weight_b against load_b * weight_a: exact.
    let ratio = |i: usize| (loads[i] as u128, u128::from(weights[i]));
    let (min_load, min_weight) =
        (0..weights.len()).filter(|&i| eligible(i)).map(ratio).min_by(|a, b| (a.0 * b.1).cmp(&(b.0 * a.1)))?;
    rr.pick(weights, |i| eligible(i) && ratio(i).0 * min_weight == min_load * ratio(i).1)
}

/// The power of two choices: two distinct servers drawn at random by weight, the one
/// with fewer requests in progress per unit of weight wins (the first drawn on a tie).
/// Nearly as even as `least_conn` without every pick reading every server.
pub fn random_two(
    weights: &[u32],
    loads: &[usize],
    eligible: impl Fn(usize) -> bool,
    rng: &mut fastrand::Rng,
) -> Option<usize> {
    let first = weighted_draw(weights, &eligible, rng)?;
    let Some(second) = weighted_draw(weights, |i| eligible(i) && i != first, rng) else { return Some(first) };
    let less_busy =
        (loads[second] as u128) * u128::from(weights[first]) < (loads[first] as u128) * u128::from(weights[second]);
    Some(if less_busy { second } else { first })
}

fn weighted_draw(weights: &[u32], eligible: impl Fn(usize) -> bool, rng: &mut fastrand::Rng) -> Option<usize> {
    let total: u64 = (0..weights.len()).filter(|&i| eligible(i)).map(|i| u64::from(weights[i])).sum();
    if total == 0 {
        return None;
    }
    let mut ticket = rng.u64(..total);
    (0..weights.len()).filter(|&i| eligible(i)).find(|&i| {
        let w = u64::from(weights[i]);
        if ticket < w {
            return true;
        }
        ticket -= w;
        false
    })
}

/// Weighted rendezvous hashing (highest random weight): every server scores the key,
/// `weight / -ln(u)` with `u` uniform in (0, 1) from a hash of key and server, and the
/// highest score wins. A key's server changes only when that server leaves or a new one
/// outscores it, so adding one of N+1 equal servers moves 1/(N+1) of the keys; a server
/// taken out hands its keys to their second choice and gets them back on return.
/// O(servers) per pick, where a ring is O(log n) but needs thousands of points per server
/// for the same evenness; upstreams have few servers.
pub fn rendezvous(key: u64, ids: &[u64], weights: &[u32], eligible: impl Fn(usize) -> bool) -> Option<usize> {
    let score = |i: usize| {
        let h = mix(key ^ ids[i]);
        // The top 53 bits as a float strictly inside (0, 1).
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        f64::from(weights[i]) / -u.ln()
    };
    let scored: SmallVec<[(usize, f64); 8]> = (0..ids.len()).filter(|&i| eligible(i)).map(|i| (i, score(i))).collect();
    scored.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(i, _)| i)
}

/// A server's identity in `rendezvous`: a fixed function of its address, so that every
/// instance of the proxy sends a key to the same server.
pub fn server_id(address: &str) -> u64 {
    let digest = sha1_smol::Sha1::from(address).digest().bytes();
    u64::from_le_bytes([digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7]])
}

/// murmur3's 64-bit finalizer: every input bit flips about half of the output bits, so
/// `key ^ id` for nearby ids gives unrelated scores.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(picks: impl Iterator<Item = usize>, servers: usize) -> Vec<usize> {
        let mut counts = vec![0; servers];
        for i in picks {
            counts[i] += 1;
        }
        counts
    }

    #[test]
    fn smooth_round_robin_interleaves_by_weight() {
        let rr = SmoothRoundRobin::new(3);
        let order: Vec<_> = (0..7).map(|_| rr.pick(&[5, 1, 1], |_| true).unwrap()).collect();
        assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn round_robin_skips_servers_that_are_not_eligible() {
        let rr = SmoothRoundRobin::new(3);
        let counts = shares((0..100).map(|_| rr.pick(&[1, 1, 1], |i| i != 1).unwrap()), 3);
        assert_eq!(counts, [50, 0, 50]);
        assert_eq!(rr.pick(&[1, 1, 1], |_| false), None);
    }

    #[test]
    fn least_conn_prefers_the_least_loaded_per_weight_and_rotates_on_ties() {
        let rr = SmoothRoundRobin::new(3);
        // 4/2 = 2 per unit against 3/1 and 5/1.
        assert_eq!(least_conn(&rr, &[2, 1, 1], &[4, 3, 5], |_| true), Some(0));
        assert_eq!(least_conn(&rr, &[1, 1, 1], &[4, 3, 5], |i| i != 1), Some(0));
        let counts = shares((0..90).map(|_| least_conn(&rr, &[1, 2, 3], &[0, 0, 0], |_| true).unwrap()), 3);
        assert_eq!(counts, [15, 30, 45]);
    }

    #[test]
    fn random_two_follows_weights_when_idle_and_avoids_the_busy() {
        let mut rng = fastrand::Rng::with_seed(7);
        let counts = shares((0..60_000).map(|_| random_two(&[1, 2, 3], &[0, 0, 0], |_| true, &mut rng).unwrap()), 3);
        for (got, want) in counts.iter().zip([10_000, 20_000, 30_000]) {
            assert!(got.abs_diff(want) < 600, "{counts:?}");
        }
        // The busy server wins only when drawn twice, which distinct draws never do.
        let busy = shares((0..1000).map(|_| random_two(&[1, 1], &[9, 0], |_| true, &mut rng).unwrap()), 2);
        assert_eq!(busy, [0, 1000]);
        assert_eq!(random_two(&[1, 1], &[9, 0], |i| i == 0, &mut rng), Some(0));
    }

    #[test]
    fn hash_keeps_a_key_on_one_server_with_shares_by_weight() {
        let ids: Vec<u64> = (0..3).map(|i| server_id(&format!("10.0.0.{i}:80"))).collect();
        let pick = |key: u64| rendezvous(mix(key), &ids, &[1, 1, 2], |_| true).unwrap();
        assert!((0..1000).all(|k| pick(k) == pick(k)));
        let counts = shares((0..100_000).map(pick), 3);
        for (got, want) in counts.iter().zip([25_000, 25_000, 50_000]) {
            assert!(got.abs_diff(want) < 1000, "{counts:?}");
        }
    }

    #[test]
    fn adding_a_server_moves_about_one_in_n_keys_and_only_to_it() {
        let ids: Vec<u64> = (0..5).map(|i| server_id(&format!("10.0.0.{i}:80"))).collect();
        let keys = 100_000u64;
        let (before, after) = (&ids[..4], &ids[..5]);
        let mut moved = 0;
        for key in (0..keys).map(mix) {
            let was = rendezvous(key, before, &[1; 4], |_| true).unwrap();
            let now = rendezvous(key, after, &[1; 5], |_| true).unwrap();
            if was != now {
                assert_eq!(now, 4, "a key moved between old servers");
                moved += 1;
            }
        }
        // 1/5 of the keys, within 2 %.
        assert!((moved as f64 / keys as f64 - 0.2).abs() < 0.02, "{moved} of {keys} moved");
    }

    #[test]
    fn a_server_taken_out_hands_only_its_own_keys_to_others() {
        let ids: Vec<u64> = (0..4).map(|i| server_id(&format!("10.0.0.{i}:80"))).collect();
        for key in (0..10_000u64).map(mix) {
            let was = rendezvous(key, &ids, &[1; 4], |_| true).unwrap();
            let now = rendezvous(key, &ids, &[1; 4], |i| i != 2).unwrap();
            assert!(was == now || was == 2);
        }
    }
}
