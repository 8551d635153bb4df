//! Limits whose `map` counts only some requests: a tier (only some header values or
//! tokens) becomes an override of a limit on the same location that leaves those values
//! out; a map of the request method becomes one route per set of methods.

use super::keys::Matcher;
use super::limits::{Applied, Limits, Listed};
use super::notes::Notes;
use super::syntax::At;

/// Limits that count only some requests (a map whose default is empty, e.g. a paid
/// tier) become overrides of a limit on the same location that exempts those requests.
/// Returns the limits the route lists, and the tiers reached through them.
pub fn pair_tiers(
    limits: &mut Limits<'_>,
    applied: Vec<Applied>,
    notes: &mut Notes,
    comments: &mut Vec<String>,
) -> (Vec<Applied>, Vec<String>) {
    let (mut kept, mut tiers) = (Vec::new(), Vec::new());
    for tier in &applied {
        let Some(only) = tier.key.only.as_ref().filter(|o| !o.iter().any(|m| matches!(m, Matcher::Method(_)))) else {
            kept.push(tier.clone());
            continue;
        };
        let partner = applied.iter().find(|p| p.key.only.is_none() && only.iter().all(|m| p.key.exempt.contains(m)));
        let paired = match partner {
            Some(p) => limits.add_overrides(&p.name, only, &tier.name),
            None => Err("sluicegate counts such requests only through an override of a limit on the same location whose map leaves them out".into()),
        };
        match paired {
            Ok(()) => tiers.push(tier.name.clone()),
            Err(why) => {
                let why = format!("zone of {} counts only some requests: {why}", tier.name);
                comments.push(format!("left out: {}", notes.left_out_at(&tier.at, tier.directive, why)));
            }
        }
    }
    (kept, tiers)
}

/// Notes a route (`name`, at `at`) that lists a limit handing requests to a tier the
/// route lacks (neither in `listed` nor in `tiers`): there sluicegate counts them by the
/// tier, where nginx counted them by neither.
pub fn check_overrides(
    limits: &Limits<'_>,
    name: &str,
    listed: &[String],
    tiers: &[String],
    at: &At,
    notes: &mut Notes,
) {
    for limit in listed {
        for (_, to) in limits.overrides_of(limit) {
            if !listed.contains(&to) && !tiers.contains(&to) {
                let why = format!(
                    "route {name}: {limit} hands some requests to {to}, which nginx does not apply at this location"
                );
                notes.left_out_at(at, "limit_req", why);
            }
        }
    }
}

/// The routes a location's limits need when their maps tell methods apart: one per
/// set of methods with the same limits (each with the line's own burst, if any), then
/// one for every other method.
pub fn split_by_methods(applied: &[Applied]) -> Vec<(Vec<String>, Vec<Listed>)> {
    let methods_of = |matchers: &[Matcher]| -> Vec<String> {
        matchers.iter().filter_map(|m| if let Matcher::Method(x) = m { Some(x.clone()) } else { None }).collect()
    };
    // Per limit: the methods it counts only, or the methods it leaves out.
    let conditions: Vec<(Option<Vec<String>>, Vec<String>)> =
        applied.iter().map(|a| (a.key.only.as_deref().map(methods_of), methods_of(&a.key.exempt))).collect();
    let applies = |i: usize, method: Option<&str>| match (&conditions[i], method) {
        ((Some(only), _), Some(m)) => only.iter().any(|x| x == m),
        ((Some(_), _), None) => false,
        ((None, except), Some(m)) => !except.iter().any(|x| x == m),
        ((None, _), None) => true,
    };
    let mut mentioned: Vec<String> =
        conditions.iter().flat_map(|(o, e)| o.iter().flatten().chain(e)).cloned().collect();
    mentioned.sort();
    mentioned.dedup();
    let names = |method: Option<&str>| -> Vec<Listed> {
        (0..applied.len())
            .filter(|&i| applies(i, method))
            .map(|i| (applied[i].name.clone(), applied[i].burst))
            .collect()
    };
    let mut out: Vec<(Vec<String>, Vec<Listed>)> = Vec::new();
    for m in &mentioned {
        let limits = names(Some(m));
        match out.iter_mut().find(|(_, l)| *l == limits) {
            Some((methods, _)) => methods.push(m.clone()),
            None => out.push((vec![m.clone()], limits)),
        }
    }
    out.push((Vec::new(), names(None)));
    out
}
