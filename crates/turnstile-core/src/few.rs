//! A list that holds one element without allocating: most checks have one policy.

use std::mem::ManuallyDrop;

/// One element (inline), or any other number (in a `Vec`, which holds no memory when empty).
/// Two variants, so that a `Few`'s variant is one comparison of the element's niche (its
/// drop, inlined or not, tests one value), and each length has one form: one element is
/// always [`Few::One`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Few<T> {
    One(T),
    Many(Heap<T>),
}

/// [`Few::Many`]'s elements: a `Vec` dropped out of line, so that dropping a [`Few`] (and
/// what holds one, such as a decision) is a few instructions where it is dropped, with no
/// loop over elements to inline there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Heap<T>(ManuallyDrop<Vec<T>>);

impl<T> Heap<T> {
    fn new(v: Vec<T>) -> Self {
        Heap(ManuallyDrop::new(v))
    }

    /// The elements, leaving none behind.
    fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut *self.0)
    }
}

impl<T> Drop for Heap<T> {
    /// Drops the elements (the empty `Vec` left in their place holds no memory).
    #[inline(never)]
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl<T> Few<T> {
    /// No elements (no allocation).
    pub(crate) fn none() -> Self {
        Few::Many(Heap::new(Vec::new()))
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Few::One(t) => std::slice::from_ref(t),
            Few::Many(v) => &v.0,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Few::One(t) => std::slice::from_mut(t),
            Few::Many(v) => &mut v.0,
        }
    }

    pub(crate) fn from_vec(mut v: Vec<T>) -> Self {
        if v.len() == 1 {
            if let Some(t) = v.pop() {
                return Few::One(t);
            }
        }
        Few::Many(Heap::new(v))
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Few::none();
        };
        let Some(second) = iter.next() else {
            return Few::One(first);
        };
        let mut v = Vec::with_capacity(2 + iter.size_hint().0);
        v.push(first);
        v.push(second);
        v.extend(iter);
        Few::Many(Heap::new(v))
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = FewIter<T>;

    fn into_iter(self) -> FewIter<T> {
        match self {
            Few::One(t) => FewIter::One(Some(t)),
            Few::Many(mut v) => FewIter::Vec(v.take().into_iter()),
        }
    }
}

/// The owning iterator of [`Few`].
pub(crate) enum FewIter<T> {
    One(Option<T>),
    Vec(std::vec::IntoIter<T>),
}

impl<T> Iterator for FewIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            FewIter::One(t) => t.take(),
            FewIter::Vec(v) => v.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn many_drops_its_elements_once() {
        let rc = Rc::new(0);
        let many = Few::from_vec(vec![Rc::clone(&rc), Rc::clone(&rc), Rc::clone(&rc)]);
        let copy = many.clone();
        assert_eq!(Rc::strong_count(&rc), 7);
        drop(many);
        assert_eq!(Rc::strong_count(&rc), 4);
        assert_eq!(copy.into_iter().count(), 3);
        assert_eq!(Rc::strong_count(&rc), 1);
    }
}
