//! One check: its [`Request`], and the paths it takes by what the key holds.
//!
//! - A key holding one packed bucket state of the single default policy is decided in place
//!   on the packed words ([`MemoryBackend::check_inner`], inlined into every caller).
//! - A new key, or one packed state (a fixed window too) of the single default policy, is
//!   still decided without the general evaluation ([`MemoryBackend::check_one`]).
//! - Anything else — configuration, several policies, sliding windows and logs, changed
//!   parameters — takes the general path (`general.rs`).

use super::backend::{Answer, MemoryBackend};
use super::entry::{Head, PolicyId, Tag};
use super::fast::{self, Fast, FRESH_WORDS};
use super::lock;
use super::shard::{Lookup, Shard, ShardCell};
use super::sweep::Now;
use super::table::Entry;
use crate::algorithm::{eval, Packed, State};
use crate::backend::{check_key_len, BackendError, CheckResult};
use crate::decision::{Decision, PolicyDecision};
use crate::policy::Policy;
use crate::quota::{validate_policy_set, Applied, Limits, Mode, Tier};
use crate::shared::SharedPolicy;

/// One check as the backend's paths take it: the key looked up, the policies its
/// configuration resolves among, the cost (units) and the time.
pub(super) struct Request<'r> {
    /// The key's hash and bytes.
    pub(super) at: Lookup<'r>,
    /// The policies of a key without configuration (with [`Unconfigured::Defaults`](crate::Unconfigured::Defaults)).
    pub(super) defaults: &'r [Policy],
    /// The tiers a key's configuration may name.
    pub(super) tiers: &'r [Tier],
    /// What the defaults are to a key (see [`Limits::stored_only`]).
    pub(super) mode: Mode,
    /// The request's cost in units (0: a query).
    pub(super) cost: u64,
    /// When, and on which time base.
    pub(super) now: Now,
}

impl Request<'_> {
    /// The single default policy, when a key without configuration gets exactly it.
    #[inline(always)]
    fn one_default(&self) -> Option<&Policy> {
        match (self.defaults, self.mode) {
            ([policy], Mode::Defaults) => Some(policy),
            _ => None,
        }
    }
}

/// Where a check's key lives: its shard's cell, the locked shard, and the index of the key's
/// entry if it has one.
pub(super) struct Place<'s> {
    pub(super) cell: &'s ShardCell,
    pub(super) shard: &'s mut Shard,
    pub(super) index: Option<usize>,
}

impl<C> MemoryBackend<C> {
    /// A check of `policies` (the defaults, no tiers) at `now`.
    #[inline(always)]
    pub(super) fn check_policies<A: Answer>(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now: Now,
    ) -> A {
        if let Err(e) = validate_policy_set(policies) {
            return A::answer(Err(BackendError::InvalidRequest(e.to_string())));
        }
        self.check_inner(key, policies, &Limits::NO_TIERS, Mode::Defaults, cost, now)
    }

    /// Checks `key`: the policies its configuration resolves to (see
    /// [`Backend::check_limits`](crate::Backend::check_limits)) at `now`. One hash of the
    /// key picks its shard and finds its entry; a key holding one packed bucket state of the
    /// single default policy is decided in place, anything else by
    /// [`MemoryBackend::check_one`] or the general path. The answer comes back as `A` (the
    /// result itself, or the future a [`Backend`](crate::Backend) method returns), built in
    /// place.
    ///
    /// Inlined into its callers (the `Backend` methods, and theirs): the answer is then built
    /// where the caller keeps it, and the caller reads what it needs of it without copying
    /// it whole (60 instructions of about 500 per check). The other paths stay out of line,
    /// so no other path's answer merges with this one's on the way out.
    #[inline(always)]
    pub(crate) fn check_inner<A: Answer>(
        &self,
        key: &str,
        defaults: &[Policy],
        tiers: &[Tier],
        mode: Mode,
        cost: u64,
        now: Now,
    ) -> A {
        if let Err(e) = check_key_len(key, self.inner.max_key_bytes) {
            return A::answer(Err(e));
        }
        let at = Lookup::new(&self.inner.hasher, key);
        let cell = self.cell(at.hash);
        self.sweep_elsewhere(cell, now);
        let mut shard = lock::lock(&cell.shard);
        let shard = &mut *shard;
        let mut index = shard.table.find(at.hash, &at.probe);
        let mut passed = false;
        if shard.due(now) {
            // The key's own entry stays, expired or not, when the check takes units: it
            // overwrites the entry in place. A query (cost 0) writes nothing: it lets the
            // sweep drop an expired entry, and looks again.
            (index, passed) = if cost > 0 {
                self.sweep_sparing(cell, shard, now, index)
            } else {
                self.sweep_sparing(cell, shard, now, None);
                (shard.table.find(at.hash, &at.probe), false)
            };
        }
        if let ([policy], Mode::Defaults) = (defaults, mode) {
            if let Some((shared, f)) = in_place(cell, shard, index, policy, cost, now) {
                if passed {
                    shard.note_entry(cell, index);
                }
                // Built once, from scalars, in the place it is returned from.
                let d = PolicyDecision::bucket(shared, f.debts);
                return A::answer(Ok(Decision::one(d, Applied::Defaults, 0)));
            }
        }
        if passed {
            // Its expiry before the check: a lower bound, as no check brings a key's
            // expiry earlier without noting it.
            shard.note_entry(cell, index);
        }
        // The request as one value from here on only: made on the in-place path, its fields
        // would be written to memory on every check.
        let req = Request {
            at,
            defaults,
            tiers,
            mode,
            cost,
            now,
        };
        self.check_one(Place { cell, shard, index }, &req)
    }

    /// Every check but a packed bucket decided in place: a new key or one packed state (a
    /// fixed window too) of the single default policy, still without the general
    /// evaluation; else the general path. Out of line, its answer built where the caller
    /// keeps it (returned as `A`, not merged with the in-place path's on the way out).
    #[inline(never)]
    fn check_one<A: Answer>(&self, mut place: Place<'_>, req: &Request<'_>) -> A {
        let result = match self.one_policy(&mut place, req) {
            Some(result) => result,
            None => self.check_general(place, req),
        };
        A::answer(result)
    }

    /// One default policy, on a key that is new or holds one packed state of that very
    /// policy (same name and parameters), without configuration; `None` for the general
    /// path.
    #[inline(always)]
    fn one_policy(&self, place: &mut Place<'_>, req: &Request<'_>) -> Option<CheckResult> {
        let policy = req.one_default()?;
        let (stored, words) = match place.index {
            Some(i) => match place.shard.table.get(i).map(|e| &e.head) {
                Some(&Head::One { tag, c, a, b }) => {
                    let kind = tag.kind();
                    (Some(tag.policy()), Packed { kind, a, b, c })
                }
                _ => return None,
            },
            None => (None, FRESH_WORDS),
        };
        // The state must be this policy's, with these parameters (else: carry-over).
        let policies = &mut place.shard.policies;
        let id = match stored {
            Some(id) => policies.get_if(id, policy).map(|_| id)?,
            None => policies.intern(policy),
        };
        let shared = policies.get(id)?.clone();
        // Buckets decide on the packed words; fixed windows on the unpacked state.
        let Some(f) = fast::decide(policy, words, req.now.ms, req.cost) else {
            return Some(self.one_unpacked(place, req, policy, id, shared, words));
        };
        if let Some(w) = f.write {
            let tag = Tag::new(id, w.kind, req.now.explicit)?;
            if let Err(err) = self.write_words(place, req, id, tag, &f, policy.limit()) {
                return Some(Err(err));
            }
        }
        let d = PolicyDecision::bucket(shared, f.debts);
        Some(Ok(Decision::one(d, Applied::Defaults, 0)))
    }

    /// [`MemoryBackend::one_policy`] for a state that does not decide on its packed words (a
    /// fixed window): unpacked, evaluated, stored packed again if it changed.
    fn one_unpacked(
        &self,
        place: &mut Place<'_>,
        req: &Request<'_>,
        policy: &Policy,
        id: PolicyId,
        shared: SharedPolicy,
        words: Packed,
    ) -> CheckResult {
        let limit = policy.limit();
        let mut state = State::unpack(words, limit);
        let e = eval(policy, &state, req.now.ms, req.cost);
        if e.allowed && e.changes_state() {
            e.apply(&mut state);
            let head = Head::single(id, limit, state, e.expires_at_ms, req.now.explicit);
            self.put_one(place, req, id, head, e.expires_at_ms)?;
        }
        Ok(Decision::one(e.decision(shared), Applied::Defaults, 0))
    }

    /// Writes a packed bucket's new words `f.write` (tagged `tag`, of policy `id` whose limit
    /// is `limit`) for the key of `req`: in place, or as a new entry.
    fn write_words(
        &self,
        place: &mut Place<'_>,
        req: &Request<'_>,
        id: PolicyId,
        tag: Tag,
        f: &Fast,
        limit: u64,
    ) -> Result<(), BackendError> {
        let Some(w) = f.write else { return Ok(()) };
        let explicit = req.now.explicit;
        match place.index.and_then(|i| place.shard.table.get_mut(i)) {
            // The packed state in place (no new head to drop the old one for). An admission
            // never brings a bucket's expiry forward (it is the last update plus the debt's
            // time then, and the debt grows by the cost), so the shard's bounds still hold:
            // the sweep's round has seen the entry's old expiry or will see the new one. Only
            // a key moving to the other time base is noted.
            Some(Entry {
                head: Head::One { tag: t, c, a, b },
                ..
            }) => {
                let moved = t.explicit() != explicit;
                (*t, *c, *a, *b) = (tag, w.c, w.a, w.b);
                if moved {
                    let expires_ms = fast::expires_at(f.now, f.debts.after, limit);
                    place.shard.note(place.cell, expires_ms, explicit);
                }
                Ok(())
            }
            _ => {
                // The exact expiry (a division) only when it may lower the bound.
                let floor = fast::expires_no_earlier_than(f.now, f.debts.after, limit);
                let expires_ms = if floor < place.shard.round_min[usize::from(explicit)] {
                    fast::expires_at(f.now, f.debts.after, limit)
                } else {
                    floor
                };
                let head = Head::One {
                    tag,
                    c: w.c,
                    a: w.a,
                    b: w.b,
                };
                self.put_one(place, req, id, head, expires_ms)
            }
        }
    }

    /// Stores a packed path's `head` for the key of `req`: at its entry, or as a new entry
    /// (within the key cap) referring to policy `id`; notes its expiry.
    #[inline(always)]
    fn put_one(
        &self,
        place: &mut Place<'_>,
        req: &Request<'_>,
        id: PolicyId,
        head: Head,
        expires_ms: u64,
    ) -> Result<(), BackendError> {
        let Place { cell, shard, index } = place;
        match index.and_then(|i| shard.table.get_mut(i)) {
            Some(e) => e.head = head,
            None => {
                // Referred to before the room is made: a sweep that empties the shard drops
                // the policies nothing refers to, which must not include this one.
                shard.policies.acquire(id);
                if let Err(e) = self.reserve_key(cell, shard, req.now) {
                    shard.policies.release(id);
                    return Err(e);
                }
                let entry = Entry {
                    key: req.at.probe.to_key(),
                    head,
                };
                shard.table.insert(&self.inner.hasher, req.at.hash, entry);
            }
        }
        shard.note(cell, expires_ms, req.now.explicit);
        Ok(())
    }
}

/// The commonest check: the single default policy `policy` (unconfigured keys get the
/// defaults) on a key holding one packed bucket state of that very policy (same name and parameters), decided
/// and written in place, one look at the entry; `None` for any other check. An admission
/// never brings a bucket's expiry forward (it is the last update plus the debt's time then,
/// and the debt grows by the cost), so the shard's bounds still hold: the sweep's round has
/// seen the entry's old expiry or will see the new one. Only a key moving to the other time
/// base is noted.
#[inline(always)]
fn in_place(
    cell: &ShardCell,
    shard: &mut Shard,
    index: Option<usize>,
    policy: &Policy,
    cost: u64,
    now: Now,
) -> Option<(SharedPolicy, Fast)> {
    let Some(Entry {
        head: Head::One { tag, c, a, b },
        ..
    }) = index.and_then(|i| shard.table.get_mut(i))
    else {
        return None;
    };
    let words = Packed {
        kind: tag.kind(),
        a: *a,
        b: *b,
        c: *c,
    };
    let shared = shard.policies.get_if(tag.policy(), policy)?;
    let f = fast::decide(policy, words, now.ms, cost)?;
    let shared = shared.clone();
    if let Some(w) = f.write {
        (*c, *a, *b) = (w.c, w.a, w.b);
        // The tag changes only with the state's kind or time base (a fresh key's first
        // write, a key moving between time bases).
        let moved = tag.explicit() != now.explicit;
        if w.kind != words.kind || moved {
            *tag = tag.with_state(w.kind, now.explicit);
        }
        if moved {
            let expires_ms = fast::expires_at(f.now, f.debts.after, policy.limit());
            shard.note(cell, expires_ms, now.explicit);
        }
    }
    Some((shared, f))
}
