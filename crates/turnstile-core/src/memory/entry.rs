//! What the in-memory backend keeps per key, and the policies its entries refer to.
//!
//! Most keys have one policy of a bucket or a fixed window and no configuration: their state
//! is packed into the entry itself ([`Head::One`], 24 bytes, no allocation). Everything else
//! — several policies, a sliding window or log, an override, a tier, a version — lives in a
//! boxed [`Full`] entry. Entries name their policies by a [`PolicyId`] into the shard's
//! [`Policies`], which also hand decisions each policy's interned copy (no reference
//! counting per decision).

use std::num::NonZeroU32;

use super::fast;
use crate::algorithm::{eval, Packed, State};
use crate::policy::Policy;
use crate::quota::KeyConfig;
use crate::shared::SharedPolicy;

/// How long a key's version is kept when it has no other configuration: a day, as in Redis.
const VERSION_TTL_MS: u64 = 86_400_000;

/// An index into a shard's [`Policies`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PolicyId(u32);

/// The largest policy index a [`Tag`] holds (2^26 − 1): far more than a shard sees.
const MAX_ID: u32 = (1 << 26) - 1;

/// A [`Head::One`]'s policy, state kind and time base in one non-zero word: bits 0–25 the
/// policy, 26–29 the packed state's kind, 30 whether the key was checked at explicit times,
/// 31 always set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tag(NonZeroU32);

impl Tag {
    #[inline]
    pub(super) fn new(policy: PolicyId, kind: u8, explicit: bool) -> Option<Tag> {
        if policy.0 > MAX_ID || kind > 15 {
            return None;
        }
        let bits = policy.0 | u32::from(kind) << 26 | u32::from(explicit) << 30 | 1 << 31;
        NonZeroU32::new(bits).map(Tag)
    }

    #[inline]
    pub(super) fn policy(self) -> PolicyId {
        PolicyId(self.0.get() & MAX_ID)
    }

    #[inline]
    pub(super) fn kind(self) -> u8 {
        (self.0.get() >> 26 & 15) as u8
    }

    pub(super) fn explicit(self) -> bool {
        self.0.get() >> 30 & 1 == 1
    }

    /// The same policy with a packed state of `kind` (below 16) on the time base
    /// `explicit`.
    #[inline]
    pub(super) fn with_state(self, kind: u8, explicit: bool) -> Tag {
        const SET: NonZeroU32 = NonZeroU32::MIN.saturating_add((1 << 31) - 1);
        let bits = (self.0.get() & MAX_ID) | u32::from(kind & 15) << 26 | u32::from(explicit) << 30;
        Tag(SET | bits)
    }
}

/// A key's policies, state and configuration.
pub(super) enum Head {
    /// One policy's packed state, no configuration.
    One { tag: Tag, c: u32, a: u64, b: u64 },
    /// Anything else.
    Full(Box<Full>),
}

/// A key's entry when it is not one packed state.
#[derive(Default)]
pub(super) struct Full {
    /// Max of the slots' `expires_ms`; `u64::MAX` while the key has an override or a tier.
    pub(super) expires_ms: u64,
    pub(super) slots: Vec<Slot>,
    pub(super) config: Option<Box<KeyConfig>>,
    /// Until when a version without other configuration is kept.
    pub(super) version_until_ms: u64,
    /// Whether the key was last written at an explicit time (a simulation): then only checks
    /// at explicit times sweep it, never the clock.
    pub(super) explicit: bool,
}

/// One policy's state in a [`Full`] entry.
pub(super) struct Slot {
    /// The policy the state was last written under (name and parameters).
    pub(super) policy: PolicyId,
    pub(super) expires_ms: u64,
    pub(super) state: State,
}

impl Head {
    /// A key with nothing in it yet (an entry about to be written).
    pub(super) fn empty(explicit: bool) -> Head {
        Head::Full(Box::new(Full {
            explicit,
            ..Full::default()
        }))
    }

    /// One packed state of `policy` (whose limit is `limit`), if it packs.
    pub(super) fn one(policy: PolicyId, limit: u64, state: &State, explicit: bool) -> Option<Head> {
        let p = state.pack(limit)?;
        Some(Head::One {
            tag: Tag::new(policy, p.kind, explicit)?,
            c: p.c,
            a: p.a,
            b: p.b,
        })
    }

    /// One policy's state, expiring at `expires_ms`: packed if it packs, else in a [`Full`]
    /// entry of one slot.
    pub(super) fn single(
        policy: PolicyId,
        limit: u64,
        state: State,
        expires_ms: u64,
        explicit: bool,
    ) -> Head {
        Head::one(policy, limit, &state, explicit).unwrap_or_else(|| {
            Head::Full(Box::new(Full {
                expires_ms,
                slots: vec![Slot {
                    policy,
                    expires_ms,
                    state,
                }],
                config: None,
                version_until_ms: 0,
                explicit,
            }))
        })
    }

    /// The packed policy and state of a [`Head::One`] (its policy from `policies`).
    pub(super) fn as_one(&self, policies: &Policies) -> Option<(PolicyId, State)> {
        match *self {
            Head::One { tag, c, a, b } => {
                let limit = policies.get(tag.policy()).map_or(1, |p| p.limit());
                let packed = Packed {
                    kind: tag.kind(),
                    a,
                    b,
                    c,
                };
                Some((tag.policy(), State::unpack(packed, limit)))
            }
            Head::Full(_) => None,
        }
    }

    /// The key's configuration, if any.
    pub(super) fn config(&self) -> Option<&KeyConfig> {
        match self {
            Head::One { .. } => None,
            Head::Full(f) => f.config.as_deref(),
        }
    }

    /// Whether the key was last written at explicit times.
    pub(super) fn explicit(&self) -> bool {
        match self {
            Head::One { tag, .. } => tag.explicit(),
            Head::Full(f) => f.explicit,
        }
    }

    /// When the key's whole state expires (ms, on its time base); `u64::MAX` when it has a
    /// configuration.
    pub(super) fn expires_ms(&self, policies: &Policies) -> u64 {
        match *self {
            Head::Full(ref f) => f.expires_ms,
            // A packed bucket: its debt at its last update, decided on the words (the
            // `fast_path_decides_as_the_algorithms_do` property holds this equal to the
            // general evaluation), so a sweep looks at an entry without unpacking it.
            Head::One { tag, c, a, b } => {
                let Some(p) = policies.get(tag.policy()) else {
                    return 0;
                };
                let kind = tag.kind();
                match fast::decide(p, Packed { kind, a, b, c }, a, 0) {
                    Some(f) => fast::expires_at(f.now, f.debts.after, p.limit()),
                    None => self
                        .as_one(policies)
                        .map(|(_, state)| expires_at(p, &state))
                        .unwrap_or(0),
                }
            }
        }
    }

    /// [`Head::expires_ms`] by the general evaluation (for tests).
    #[cfg(test)]
    pub(super) fn expires_ms_general(&self, policies: &Policies) -> u64 {
        match self {
            Head::Full(f) => f.expires_ms,
            Head::One { .. } => self
                .as_one(policies)
                .and_then(|(id, state)| Some(expires_at(policies.get(id)?, &state)))
                .unwrap_or(0),
        }
    }

    /// The [`Full`] entry, converting a packed one first (its policy from `policies`).
    pub(super) fn full_mut(&mut self, policies: &Policies) -> &mut Full {
        if let Some((id, state)) = self.as_one(policies) {
            let explicit = self.explicit();
            let expires_ms = policies.get(id).map_or(0, |p| expires_at(p, &state));
            *self = Head::Full(Box::new(Full {
                expires_ms,
                slots: vec![Slot {
                    policy: id,
                    expires_ms,
                    state,
                }],
                config: None,
                version_until_ms: 0,
                explicit,
            }));
        }
        match self {
            Head::Full(f) => f,
            // Converted above: never reached.
            Head::One { .. } => {
                *self = Head::Full(Box::default());
                self.full_mut(policies)
            }
        }
    }

    /// Packs a [`Full`] entry that holds one policy's packable state and no configuration.
    pub(super) fn compact(&mut self, policies: &Policies) {
        let Head::Full(f) = self else { return };
        if f.config.is_some() {
            return;
        }
        let [slot] = f.slots.as_slice() else { return };
        let Some(limit) = policies.get(slot.policy).map(|p| p.limit()) else {
            return;
        };
        if let Some(one) = Head::one(slot.policy, limit, &slot.state, f.explicit) {
            *self = one;
        }
    }

    /// Every policy the entry refers to.
    pub(super) fn policy_ids(&self) -> impl Iterator<Item = PolicyId> + '_ {
        let (one, slots) = match self {
            Head::One { tag, .. } => (Some(tag.policy()), &[][..]),
            Head::Full(f) => (None, f.slots.as_slice()),
        };
        one.into_iter().chain(slots.iter().map(|s| s.policy))
    }
}

impl Slot {
    /// The slot holds `state`, carried over to `p`'s parameters (see
    /// [`carry_over`](crate::algorithm::carry_over)), and refers to `p` from now on.
    pub(super) fn carried(&mut self, policies: &mut Policies, p: &Policy, state: State) {
        let id = policies.intern(p);
        policies.acquire(id);
        policies.release(self.policy);
        self.policy = id;
        self.state = state;
    }
}

impl Full {
    /// The index of the slot of the policy named `name` (names are unique in an entry).
    pub(super) fn slot_named(&self, policies: &Policies, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| policies.get(s.policy).is_some_and(|q| q.name() == name))
    }

    /// Bumps the key's version; a version alone is kept a day from `now_ms`, as in Redis.
    pub(super) fn bump_version(&mut self, now_ms: u64) -> u64 {
        let config = self.config.get_or_insert_with(Box::default);
        config.version = config.version.wrapping_add(1);
        self.version_until_ms = now_ms.saturating_add(VERSION_TTL_MS);
        config.version
    }

    /// Drops expired slots (releasing their policies) and recomputes when the whole entry
    /// expires.
    pub(super) fn settle(&mut self, now_ms: u64, policies: &mut Policies) {
        self.slots.retain(|s| {
            let live = s.expires_ms > now_ms;
            if !live {
                policies.release(s.policy);
            }
            live
        });
        let configured = self.config.as_deref().is_some_and(|c| !c.is_empty());
        self.expires_ms = if configured {
            u64::MAX
        } else {
            let state = self.slots.iter().map(|s| s.expires_ms).max().unwrap_or(0);
            state.max(self.version_until_ms)
        };
    }
}

/// When `state`, written under `policy`, equals a fresh key's (ms, on its time base): its
/// last update plus its `reset_after` then, rounded up.
pub(super) fn expires_at(policy: &Policy, state: &State) -> u64 {
    eval(policy, state, state.updated_ms(), 0).expires_at_ms
}

/// A shard's policies, each held once with a count of the slots that refer to it.
#[derive(Default)]
pub(super) struct Policies {
    list: Vec<Option<Interned>>,
    free: Vec<u32>,
}

struct Interned {
    policy: SharedPolicy,
    /// The policy's name's address and its parameters, to tell a copy of it in one look.
    identity: (usize, [u64; 2]),
    refs: u32,
}

/// How many policies a shard holds before it drops those no slot refers to.
const KEEP_UNUSED: usize = 16;

impl Policies {
    #[inline]
    pub(super) fn get(&self, id: PolicyId) -> Option<&SharedPolicy> {
        Some(&self.list.get(id.0 as usize)?.as_ref()?.policy)
    }

    /// The interned copy of `id` if it is `p` (same name and parameters): one look for a
    /// copy of the policy interned, else by comparing names.
    #[inline]
    pub(super) fn get_if(&self, id: PolicyId, p: &Policy) -> Option<&SharedPolicy> {
        match self.list.get(id.0 as usize) {
            Some(Some(i)) if i.identity == p.identity() || *i.policy == *p => Some(&i.policy),
            _ => None,
        }
    }

    /// The id of `p` (same name and parameters), added if missing (referred to by nothing
    /// yet: see [`Policies::acquire`]).
    pub(super) fn intern(&mut self, p: &Policy) -> PolicyId {
        if let Some(id) = self.find(p) {
            return id;
        }
        if self.list.len() >= KEEP_UNUSED {
            self.drop_unused();
        }
        let policy = SharedPolicy::interned(p);
        let interned = Some(Interned {
            identity: policy.identity(),
            policy,
            refs: 0,
        });
        match self.free.pop() {
            Some(i) => {
                self.list[i as usize] = interned;
                PolicyId(i)
            }
            None => {
                self.list.push(interned);
                PolicyId((self.list.len() - 1) as u32)
            }
        }
    }

    /// The id of a policy of `p`'s name and parameters.
    pub(super) fn find(&self, p: &Policy) -> Option<PolicyId> {
        self.list
            .iter()
            .position(|q| q.as_ref().is_some_and(|q| *q.policy == *p))
            .map(|i| PolicyId(i as u32))
    }

    /// One more slot refers to `id`.
    pub(super) fn acquire(&mut self, id: PolicyId) {
        if let Some(Some(i)) = self.list.get_mut(id.0 as usize) {
            i.refs = i.refs.saturating_add(1);
        }
    }

    /// One slot fewer refers to `id`.
    pub(super) fn release(&mut self, id: PolicyId) {
        if let Some(Some(i)) = self.list.get_mut(id.0 as usize) {
            i.refs = i.refs.saturating_sub(1);
        }
    }

    /// Drops the policies no slot refers to (decisions keep their shared copies), and
    /// frees the lists when that leaves none.
    pub(super) fn drop_unused(&mut self) {
        for (i, slot) in self.list.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|p| p.refs == 0) {
                *slot = None;
                self.free.push(i as u32);
            }
        }
        if self.list.iter().all(Option::is_none) {
            *self = Policies::default();
        }
    }

    /// How many policies are held (for tests).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.list.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_stay_small() {
        assert_eq!(std::mem::size_of::<Head>(), 24);
    }

    #[test]
    fn tags_keep_policy_kind_and_time_base() {
        for (id, kind, explicit) in [(0, 0, false), (MAX_ID, 15, true), (12_345, 3, false)] {
            let t = Tag::new(PolicyId(id), kind, explicit).unwrap();
            assert_eq!(
                (t.policy(), t.kind(), t.explicit()),
                (PolicyId(id), kind, explicit)
            );
            for (k, e) in [(0, false), (1, true), (2, false), (15, true)] {
                assert_eq!(t.with_state(k, e), Tag::new(PolicyId(id), k, e).unwrap());
            }
        }
        assert!(Tag::new(PolicyId(MAX_ID + 1), 0, false).is_none());
    }

    #[test]
    fn unused_policies_are_dropped_and_their_ids_reused() {
        let mut ps = Policies::default();
        let p = |i: u32| -> Policy { format!("gcra:limit={},period=1s", i + 1).parse().unwrap() };
        let kept = ps.intern(&p(0));
        ps.acquire(kept);
        for i in 1..100 {
            ps.intern(&p(i));
        }
        assert!(ps.held() <= KEEP_UNUSED + 1, "{}", ps.held());
        assert_eq!(ps.find(&p(0)), Some(kept));
        assert_eq!(ps.get(kept).map(|s| s.limit()), Some(1));
        ps.release(kept);
    }
}
