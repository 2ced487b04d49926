//! [`Key`]: a client key held inline when it is short, so extracting one allocates nothing.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use arrayvec::ArrayString;

/// Bytes a [`Key`] holds without allocating: every IP key (the longest, an IPv6 network such
/// as `ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127`, is 43 bytes) and most API keys.
pub(crate) const INLINE: usize = 46;

/// A client key, as [`KeyExtractor::extract_key`](crate::key::KeyExtractor::extract_key)
/// gives it and the layer holds it while it checks a request: a string of up to 46 bytes is
/// kept inline (no allocation), a longer one on the heap, and a shared one
/// ([`MissingKey::Key`](crate::key::MissingKey::Key)) by reference count.
///
/// It dereferences to `&str`; `String::from(key)` and `Key::from(string)` convert without
/// copying a heap string.
///
/// # Examples
/// ```
/// use tower_turnstile::key::Key;
///
/// let mut key = Key::new();
/// key.push_str("192.0.2.1");
/// assert_eq!(&*key, "192.0.2.1");
/// assert_eq!(Key::from("k1"), Key::from(String::from("k1")));
/// ```
#[derive(Clone)]
pub struct Key {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Inline(ArrayString<INLINE>),
    Heap(String),
    Shared(Arc<str>),
}

impl Key {
    /// An empty key (inline).
    pub const fn new() -> Self {
        Key {
            repr: Repr::Inline(ArrayString::new_const()),
        }
    }

    /// A key written in place by the caller into an inline buffer (an IP key): no copy.
    pub(crate) fn from_inline(text: ArrayString<INLINE>) -> Self {
        Key {
            repr: Repr::Inline(text),
        }
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.repr {
            Repr::Inline(s) => s,
            Repr::Heap(s) => s,
            Repr::Shared(s) => s,
        }
    }

    /// Appends `s`: inline while the whole key fits in 46 bytes, else moved to the heap.
    pub fn push_str(&mut self, s: &str) {
        match &mut self.repr {
            Repr::Inline(inline) => {
                if inline.try_push_str(s).is_err() {
                    let mut heap = String::with_capacity((inline.len() + s.len()).max(2 * INLINE));
                    heap.push_str(inline);
                    heap.push_str(s);
                    self.repr = Repr::Heap(heap);
                }
            }
            Repr::Heap(h) => h.push_str(s),
            Repr::Shared(a) => {
                let mut heap = String::with_capacity(a.len() + s.len());
                heap.push_str(a);
                heap.push_str(s);
                self.repr = Repr::Heap(heap);
            }
        }
    }

    /// Whether the key allocates nothing of its own (inline, or shared).
    pub fn is_inline(&self) -> bool {
        !matches!(self.repr, Repr::Heap(_))
    }
}

impl Default for Key {
    fn default() -> Self {
        Key::new()
    }
}

impl Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Key {}

impl PartialEq<str> for Key {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Key {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Write for Key {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl From<&str> for Key {
    /// `s` copied: inline when it fits.
    fn from(s: &str) -> Self {
        let mut k = Key::new();
        k.push_str(s);
        k
    }
}

impl From<String> for Key {
    /// `s` itself, not copied (a short string stays where it is, on the heap).
    fn from(s: String) -> Self {
        Key {
            repr: Repr::Heap(s),
        }
    }
}

impl From<Arc<str>> for Key {
    /// Shares `s`: no copy, no allocation.
    fn from(s: Arc<str>) -> Self {
        Key {
            repr: Repr::Shared(s),
        }
    }
}

impl From<Key> for String {
    /// The key as a `String`: a heap key moved out, any other copied.
    fn from(k: Key) -> Self {
        match k.repr {
            Repr::Heap(s) => s,
            _ => k.as_str().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_stay_inline_and_long_ones_move_to_the_heap() {
        let mut k = Key::new();
        assert_eq!(k, "");
        k.push_str("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe");
        k.push_str("/127");
        assert!(k.is_inline());
        assert_eq!(k, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
        k.push_str("abc");
        assert_eq!(k.len(), 46);
        assert!(k.is_inline());
        k.push_str("é");
        assert!(!k.is_inline());
        assert_eq!(k, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127abcé");
        k.push_str("x");
        assert_eq!(
            String::from(k),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127abcéx"
        );
        let shared: Arc<str> = Arc::from("missing");
        let mut s = Key::from(Arc::clone(&shared));
        assert!(s.is_inline());
        assert_eq!(s, "missing");
        s.push_str("|1");
        assert_eq!(s, "missing|1");
        assert_eq!(Key::from("a"), Key::from(String::from("a")));
    }
}
