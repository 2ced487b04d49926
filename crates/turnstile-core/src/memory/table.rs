//! One shard's map from client keys to entries: a dense `Vec` of entries (so sweeps walk it
//! by index) and a `hashbrown` table of their indices, looked up with the hash the shard was
//! chosen by — one hash and one key comparison per lookup. Keys of up to 23 bytes (IPv4
//! addresses, IPv6 networks, most route and method names) live in the entry itself.

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hasher};

use super::entry::Head;

/// A client key: up to [`INLINE`] bytes in place, longer ones on the heap. 24 bytes.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Key {
    Inline { len: Len, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

/// The longest key kept in place.
const INLINE: usize = 23;

/// An inline key's length: an enum of 0 to 23, so the byte it lives in has room for the
/// [`Key`] variant's tag (the key stays 24 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[rustfmt::skip]
pub(super) enum Len {
    L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15, L16, L17, L18, L19,
    L20, L21, L22, L23,
}

#[rustfmt::skip]
const LENS: [Len; INLINE + 1] = [
    Len::L0, Len::L1, Len::L2, Len::L3, Len::L4, Len::L5, Len::L6, Len::L7, Len::L8, Len::L9,
    Len::L10, Len::L11, Len::L12, Len::L13, Len::L14, Len::L15, Len::L16, Len::L17, Len::L18,
    Len::L19, Len::L20, Len::L21, Len::L22, Len::L23,
];

/// A key looked up, compared with stored keys without copying it.
pub(super) struct Probe<'k> {
    bytes: &'k [u8],
}

impl<'k> Probe<'k> {
    #[inline]
    pub(super) fn new(key: &'k [u8]) -> Self {
        Probe { bytes: key }
    }

    /// Whether the key is compared as two words ([`Probe::matches_words`]): 8 to 16 bytes
    /// (an IPv4 address, most names).
    #[inline(always)]
    fn by_words(&self) -> bool {
        (8..=16).contains(&self.bytes.len())
    }

    /// Whether `key` is this key of 8 to 16 bytes: its length and two words that cover it
    /// (the loads its hash made, so they are made once per lookup). No branch on the length
    /// and no call: hashbrown's probe loop stays small enough to be inlined where the lookup
    /// is. A heap key is longer.
    #[inline(always)]
    fn matches_words(&self, key: &Key) -> bool {
        let q = self.bytes;
        let n = q.len();
        match key {
            Key::Inline { len, bytes } => {
                *len as usize == n
                    && word_at(bytes, 0) == word_at(q, 0)
                    && word_at(bytes, n.wrapping_sub(8)) == word_at(q, n.wrapping_sub(8))
            }
            Key::Heap(_) => false,
        }
    }

    /// Whether `key` is this key, of any length. Out of line: its branches on the length
    /// would otherwise be copied into every path of hashbrown's probe loop.
    #[inline(never)]
    fn matches(&self, key: &Key) -> bool {
        match key {
            Key::Inline { len, bytes } => {
                *len as usize == self.bytes.len() && same_prefix(bytes, self.bytes)
            }
            Key::Heap(b) => **b == *self.bytes,
        }
    }

    /// The key to store.
    pub(super) fn to_key(&self) -> Key {
        match LENS.get(self.bytes.len()) {
            Some(&len) => {
                let mut bytes = [0; INLINE];
                bytes[..self.bytes.len()].copy_from_slice(self.bytes);
                Key::Inline { len, bytes }
            }
            None => Key::Heap(Box::from(self.bytes)),
        }
    }
}

/// The 8 bytes of `s` from `i` as a word (0 if there are fewer).
#[inline(always)]
fn word_at(s: &[u8], i: usize) -> u64 {
    s.get(i..)
        .and_then(|s| s.first_chunk::<8>())
        .map_or(0, |w| u64::from_ne_bytes(*w))
}

/// Whether `stored` begins with `q` (at most [`INLINE`] bytes), compared a word at a time:
/// windows that overlap cover every byte, so two or three comparisons decide.
#[inline]
fn same_prefix(stored: &[u8; INLINE], q: &[u8]) -> bool {
    let n = q.len();
    let word = |s: &[u8], i: usize| -> Option<u64> {
        s.get(i..i + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_ne_bytes)
    };
    let half = |s: &[u8], i: usize| -> Option<u32> {
        s.get(i..i + 4)
            .and_then(|w| <[u8; 4]>::try_from(w).ok())
            .map(u32::from_ne_bytes)
    };
    let eq = |a: Option<u64>, b: Option<u64>| a.is_some() && a == b;
    match n {
        0..=3 => stored.get(..n) == Some(q),
        4..=7 => {
            let (a, b) = (half(stored, 0), half(q, 0));
            let (c, d) = (half(stored, n - 4), half(q, n - 4));
            a.is_some() && a == b && c == d
        }
        8..=16 => eq(word(stored, 0), word(q, 0)) && eq(word(stored, n - 8), word(q, n - 8)),
        _ => {
            eq(word(stored, 0), word(q, 0))
                && eq(word(stored, 8), word(q, 8))
                && eq(word(stored, n - 8), word(q, n - 8))
        }
    }
}

impl Key {
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..*len as usize],
            Key::Heap(b) => b,
        }
    }
}

/// The hash of a key's bytes, with the backend's seed: it picks the shard and the slot. One
/// write of the bytes (foldhash mixes their length in).
#[inline]
pub(super) fn hash_key(hasher: &RandomState, key: &[u8]) -> u64 {
    let mut h = hasher.build_hasher();
    h.write(key);
    h.finish()
}

/// One key's entry.
pub(super) struct Entry {
    pub(super) key: Key,
    pub(super) head: Head,
}

/// The entries of one shard, and an index of them by key.
#[derive(Default)]
pub(super) struct Table {
    index: HashTable<u32>,
    entries: Vec<Entry>,
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Room for entries, without growing (the entries' vector's).
    pub(super) fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&Entry> {
        self.entries.get(i)
    }

    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut Entry> {
        self.entries.get_mut(i)
    }

    pub(super) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The index of the entry of the key `probe` with hash `hash`. A key of 8 to 16 bytes
    /// is looked up with its comparison inlined, any other out of line (two copies of
    /// hashbrown's probe, each with one comparison and no branch on the key's length).
    #[inline]
    pub(super) fn find(&self, hash: u64, probe: &Probe<'_>) -> Option<usize> {
        if !probe.by_words() {
            return self.find_any(hash, probe);
        }
        let entries = &self.entries;
        self.index
            .find(hash, |&i| {
                entries
                    .get(i as usize)
                    .is_some_and(|e| probe.matches_words(&e.key))
            })
            .map(|&i| i as usize)
    }

    /// [`Table::find`] for a key of any length.
    #[inline(never)]
    fn find_any(&self, hash: u64, probe: &Probe<'_>) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash, |&i| {
                entries
                    .get(i as usize)
                    .is_some_and(|e| probe.matches(&e.key))
            })
            .map(|&i| i as usize)
    }

    /// Whether another entry fits (an index is a `u32`).
    pub(super) fn has_room(&self) -> bool {
        self.entries.len() < u32::MAX as usize
    }

    /// Appends an entry for a key not in the table (hash `hash`); returns its index. The
    /// entries grow by an eighth at a time: little room is left unused, and growing stays
    /// amortized O(1). Call only when [`Table::has_room`].
    pub(super) fn insert(&mut self, hasher: &RandomState, hash: u64, entry: Entry) -> usize {
        let i = self.entries.len();
        if i == self.entries.capacity() {
            self.entries.reserve_exact((i / 8).max(4));
        }
        self.entries.push(entry);
        let entries = &self.entries;
        self.index.insert_unique(hash, i as u32, |&j| {
            entries
                .get(j as usize)
                .map_or(0, |e| hash_key(hasher, e.key.as_bytes()))
        });
        i
    }

    /// Removes entry `i`; the last entry takes its place.
    pub(super) fn swap_remove(&mut self, hasher: &RandomState, i: usize) -> Option<Entry> {
        let last = self.entries.len().checked_sub(1)?;
        let hash = hash_key(hasher, self.entries.get(i)?.key.as_bytes());
        if let Ok(found) = self.index.find_entry(hash, |&j| j as usize == i) {
            found.remove();
        }
        if i != last {
            let moved = hash_key(hasher, self.entries[last].key.as_bytes());
            if let Some(at) = self.index.find_mut(moved, |&j| j as usize == last) {
                *at = i as u32;
            }
        }
        Some(self.entries.swap_remove(i))
    }

    /// Keeps the entries `keep` says to, in order; returns the dropped ones' heads.
    pub(super) fn retain(
        &mut self,
        hasher: &RandomState,
        mut keep: impl FnMut(&Entry) -> bool,
    ) -> Vec<Head> {
        let mut dropped = Vec::new();
        let mut kept = Vec::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            if keep(&e) {
                kept.push(e);
            } else {
                dropped.push(e.head);
            }
        }
        if !dropped.is_empty() {
            self.entries = kept;
            self.reindex(hasher);
        } else {
            self.entries = kept;
        }
        dropped
    }

    /// Gives memory back down to room for `n` entries (not below the entries there are).
    pub(super) fn shrink_to(&mut self, hasher: &RandomState, n: usize) {
        self.entries.shrink_to(n);
        let entries = &self.entries;
        self.index.shrink_to(n, |&j| {
            entries
                .get(j as usize)
                .map_or(0, |e| hash_key(hasher, e.key.as_bytes()))
        });
    }

    /// Rebuilds the index from the entries.
    fn reindex(&mut self, hasher: &RandomState) {
        self.index = HashTable::with_capacity(self.entries.len());
        let entries = &self.entries;
        for (i, e) in entries.iter().enumerate() {
            let hash = hash_key(hasher, e.key.as_bytes());
            self.index.insert_unique(hash, i as u32, |&j| {
                entries
                    .get(j as usize)
                    .map_or(0, |e| hash_key(hasher, e.key.as_bytes()))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn keys_and_entries_stay_small() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
        assert_eq!(std::mem::size_of::<Entry>(), 48);
    }

    /// Whether `key` matches `stored` by [`Probe::matches_words`], when it applies.
    fn by_words(key: &[u8], stored: &Key) -> bool {
        let probe = Probe::new(key);
        probe.by_words() && probe.matches_words(stored)
    }

    #[test]
    fn keys_compare_equal_exactly_when_their_bytes_do() {
        // Every length up to the inline maximum, and keys that differ in one byte only.
        for n in 0..=INLINE + 2 {
            let a: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(37)).collect();
            let stored = Probe::new(&a).to_key();
            assert!(Probe::new(&a).matches(&stored), "{n}");
            assert_eq!(by_words(&a, &stored), (8..=16).contains(&n), "{n}");
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 1;
                assert!(!Probe::new(&b).matches(&stored), "{n} {i}");
                assert!(!by_words(&b, &stored), "{n} {i}");
            }
            assert!(!Probe::new(&a[..n.saturating_sub(1)]).matches(&stored) || n == 0);
            assert!(!by_words(&a[..n.saturating_sub(1)], &stored) || n == 0);
            let mut longer = a.clone();
            longer.push(0);
            assert!(!Probe::new(&longer).matches(&stored), "{n}");
            assert!(!by_words(&longer, &stored), "{n}");
        }
    }

    #[test]
    fn keys_of_every_length_are_found_and_removed() {
        let hasher = RandomState::default();
        let mut t = Table::default();
        let keys: Vec<String> = (0..200)
            .map(|i| "k".repeat(i % 40) + &i.to_string())
            .collect();
        for k in &keys {
            let h = hash_key(&hasher, k.as_bytes());
            let probe = Probe::new(k.as_bytes());
            assert_eq!(t.find(h, &probe), None);
            let head = Head::empty(false);
            t.insert(
                &hasher,
                h,
                Entry {
                    key: probe.to_key(),
                    head,
                },
            );
        }
        for (i, k) in keys.iter().enumerate() {
            let h = hash_key(&hasher, k.as_bytes());
            assert_eq!(t.find(h, &Probe::new(k.as_bytes())), Some(i));
            assert_eq!(t.get(i).unwrap().key.as_bytes(), k.as_bytes());
        }
        // Remove every third key: the others stay found where they moved.
        for k in keys.iter().step_by(3) {
            let h = hash_key(&hasher, k.as_bytes());
            let i = t.find(h, &Probe::new(k.as_bytes())).unwrap();
            t.swap_remove(&hasher, i).unwrap();
        }
        for (i, k) in keys.iter().enumerate() {
            let h = hash_key(&hasher, k.as_bytes());
            let found = t.find(h, &Probe::new(k.as_bytes()));
            assert_eq!(found.is_some(), i % 3 != 0, "{k}");
            if let Some(j) = found {
                assert_eq!(t.get(j).unwrap().key.as_bytes(), k.as_bytes());
            }
        }
        let n = t.len();
        t.retain(&hasher, |e| e.key.as_bytes().len() < 20);
        assert!(t.len() < n);
        t.shrink_to(&hasher, 0);
        for k in &keys {
            let h = hash_key(&hasher, k.as_bytes());
            if let Some(j) = t.find(h, &Probe::new(k.as_bytes())) {
                assert_eq!(t.get(j).unwrap().key.as_bytes(), k.as_bytes());
                assert!(k.len() < 20);
            }
        }
    }

    /// Keys made to look alike: `stem` repeated to lengths around the word boundaries (0, 1,
    /// 7, 8, 9, 15, 16, 17, 23, 24, 25), each also with its last, first or middle byte
    /// changed, a zero byte or its last byte again appended (the same first and last words,
    /// one byte longer), and its last byte dropped.
    fn look_alikes(stem: &[u8]) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25] {
            let k: Vec<u8> = stem.iter().copied().cycle().take(n).collect();
            keys.push(k.clone());
            for at in [n.wrapping_sub(1), 0, n / 2] {
                if let Some(b) = k.get(at) {
                    let mut v = k.clone();
                    v[at] = b ^ 0x80;
                    keys.push(v);
                    let mut v = k.clone();
                    v[at] = b.wrapping_add(1);
                    keys.push(v);
                }
            }
            let mut v = k.clone();
            v.push(0);
            keys.push(v);
            if let Some(&last) = k.last() {
                let mut v = k.clone();
                v.push(last);
                keys.push(v);
                keys.push(k[..n - 1].to_vec());
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// Stems with repeated bytes (whose keys share words), zero bytes and non-ASCII UTF-8.
    const STEMS: [&str; 8] = [
        "a",
        "ab",
        "\0",
        "0123456789",
        "é",
        "日本語",
        "🦀x",
        "10.0.0.1:443/",
    ];

    #[test]
    fn look_alike_keys_compare_equal_exactly_when_they_are_equal() {
        let mut keys: Vec<Vec<u8>> = STEMS
            .iter()
            .flat_map(|s| look_alikes(s.as_bytes()))
            .collect();
        keys.sort();
        keys.dedup();
        let stored: Vec<Key> = keys.iter().map(|k| Probe::new(k).to_key()).collect();
        for (a, sa) in keys.iter().zip(&stored) {
            assert_eq!(sa.as_bytes(), &a[..]);
            for (b, sb) in keys.iter().zip(&stored) {
                let probe = Probe::new(b);
                assert_eq!(probe.matches(sa), a == b, "{a:?} {b:?}");
                if probe.by_words() {
                    assert_eq!(probe.matches_words(sa), a == b, "{a:?} {b:?}");
                }
                assert_eq!(sa == sb, a == b, "{a:?} {b:?}");
            }
        }
    }

    /// What a property test does to the table and to its model.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(usize),
        Find(usize),
        Remove(usize),
        /// Keeps the keys whose length is not `n` modulo 3.
        Retain(usize),
        Shrink,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<usize>().prop_map(Op::Insert),
            4 => any::<usize>().prop_map(Op::Find),
            3 => any::<usize>().prop_map(Op::Remove),
            1 => (0usize..3).prop_map(Op::Retain),
            1 => Just(Op::Shrink),
        ]
    }

    fn find(t: &Table, hasher: &RandomState, k: &[u8]) -> Option<usize> {
        let found = t.find(hash_key(hasher, k), &Probe::new(k));
        if let Some(i) = found {
            assert_eq!(t.get(i).map(|e| e.key.as_bytes()), Some(k));
        }
        found
    }

    proptest! {
        #[test]
        fn the_table_holds_what_a_hash_map_would(
            stems in prop::sample::subsequence(STEMS.to_vec(), 1..4),
            ops in prop::collection::vec(op(), 1..400),
        ) {
            let keys: Vec<Vec<u8>> = stems.iter().flat_map(|s| look_alikes(s.as_bytes())).collect();
            let hasher = RandomState::default();
            let mut t = Table::default();
            let mut model: HashMap<Vec<u8>, ()> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(i) => {
                        let k = &keys[i % keys.len()];
                        let found = find(&t, &hasher, k);
                        prop_assert_eq!(found.is_some(), model.contains_key(k));
                        if found.is_none() {
                            let probe = Probe::new(k);
                            let entry = Entry { key: probe.to_key(), head: Head::empty(false) };
                            t.insert(&hasher, hash_key(&hasher, k), entry);
                            model.insert(k.clone(), ());
                        }
                    }
                    Op::Find(i) => {
                        let k = &keys[i % keys.len()];
                        prop_assert_eq!(find(&t, &hasher, k).is_some(), model.contains_key(k));
                    }
                    Op::Remove(i) => {
                        let k = &keys[i % keys.len()];
                        let found = find(&t, &hasher, k);
                        prop_assert_eq!(found.is_some(), model.remove(k).is_some());
                        if let Some(j) = found {
                            let gone = t.swap_remove(&hasher, j).map(|e| e.key.as_bytes().to_vec());
                            prop_assert_eq!(gone.as_ref(), Some(k));
                        }
                    }
                    Op::Retain(n) => {
                        t.retain(&hasher, |e| e.key.as_bytes().len() % 3 != n);
                        model.retain(|k, _| k.len() % 3 != n);
                    }
                    Op::Shrink => t.shrink_to(&hasher, 0),
                }
                prop_assert_eq!(t.len(), model.len());
            }
            for k in &keys {
                prop_assert_eq!(find(&t, &hasher, k).is_some(), model.contains_key(k), "{:?}", k);
            }
        }
    }

    #[test]
    fn under_one_hash_each_look_alike_key_is_told_from_every_other_in_the_probe() {
        // Every key stored under the same hash (room made first, so nothing is rehashed):
        // each lookup compares its key with every stored one inside hashbrown's probe.
        let mut keys: Vec<Vec<u8>> = STEMS
            .iter()
            .flat_map(|s| look_alikes(s.as_bytes()))
            .collect();
        keys.sort();
        keys.dedup();
        let hasher = RandomState::default();
        let (stored, absent): (Vec<_>, Vec<_>) =
            keys.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let mut t = Table {
            index: HashTable::with_capacity(keys.len()),
            entries: Vec::with_capacity(keys.len()),
        };
        for (_, k) in &stored {
            let entry = Entry {
                key: Probe::new(k).to_key(),
                head: Head::empty(false),
            };
            t.insert(&hasher, 42, entry);
        }
        for (j, (_, k)) in stored.iter().enumerate() {
            assert_eq!(t.find(42, &Probe::new(k)), Some(j), "{k:?}");
        }
        for (_, k) in &absent {
            assert_eq!(t.find(42, &Probe::new(k)), None, "{k:?}");
        }
    }
}
