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

    /// A `Few` of `n` counted elements, built from a `Vec` or collected.
    fn built(rc: &Rc<u32>, n: usize, from_vec: bool) -> Few<Rc<u32>> {
        let items = (0..n).map(|_| Rc::clone(rc));
        if from_vec {
            Few::from_vec(items.collect())
        } else {
            items.collect()
        }
    }

    #[test]
    fn every_length_has_one_form_and_its_elements_in_order() {
        for n in 0..6 {
            let v: Vec<usize> = (10..10 + n).collect();
            let a = Few::from_vec(v.clone());
            let b: Few<usize> = v.iter().copied().collect();
            assert_eq!(a, b, "{n}");
            assert_eq!(matches!(a, Few::One(_)), n == 1, "{n}");
            assert_eq!(a.as_slice(), &v[..], "{n}");
            assert_eq!(a.clone(), a, "{n}");
            assert_eq!(a.clone().into_iter().collect::<Vec<_>>(), v, "{n}");
            // An iterator whose size hint is wrong (a filter's lower bound is 0).
            let c: Few<usize> = (0..20).filter(|i| *i < n).map(|i| i + 10).collect();
            assert_eq!(c, a, "{n}");
            let mut m = a;
            for x in m.as_mut_slice() {
                *x += 1;
            }
            let plus: Vec<usize> = v.iter().map(|x| x + 1).collect();
            assert_eq!(m.as_slice(), &plus[..], "{n}");
        }
        assert_eq!(Few::<u8>::none(), Few::from_vec(Vec::new()));
        assert!(Few::<u8>::none().as_slice().is_empty());
        assert_eq!(Few::<u8>::none().into_iter().next(), None);
    }

    #[test]
    fn every_length_drops_its_elements_once_however_it_ends() {
        let rc = Rc::new(0);
        for n in 0..6 {
            for from_vec in [true, false] {
                let few = built(&rc, n, from_vec);
                assert_eq!(Rc::strong_count(&rc), 1 + n, "{n}");
                let copy = few.clone();
                assert_eq!(Rc::strong_count(&rc), 1 + 2 * n, "{n}");
                drop(few);
                assert_eq!(Rc::strong_count(&rc), 1 + n, "{n}");
                // Iterated part way, then dropped: the rest is dropped with the iterator.
                let mut it = copy.into_iter();
                let first = it.next();
                assert_eq!(first.is_some(), n > 0, "{n}");
                drop(first);
                assert_eq!(Rc::strong_count(&rc), n.max(1), "{n}");
                drop(it);
                assert_eq!(Rc::strong_count(&rc), 1, "{n}");
            }
            // Iterated to the end, and past it.
            let few = built(&rc, n, false);
            let mut it = few.into_iter();
            assert_eq!(it.by_ref().count(), n);
            assert!(it.next().is_none());
            assert_eq!(Rc::strong_count(&rc), 1, "{n}");
        }
    }

    #[test]
    fn decisions_of_no_one_two_and_many_policies_keep_their_policies() {
        use crate::{Applied, Decision, PolicyDecision};
        use std::time::Duration;
        let pd = |i: usize| {
            PolicyDecision::new(
                format!("gcra:limit=10,period=1s,name=p{i}")
                    .parse()
                    .unwrap(),
                i != 1,
                10 - i as u64,
                (i == 1).then(|| Duration::from_millis(5)),
                Duration::from_millis(100 * i as u64),
                Duration::ZERO,
            )
        };
        for n in 0..5 {
            let list: Vec<PolicyDecision> = (0..n).map(pd).collect();
            let d = Decision::from_policies(list.clone());
            let collected: Decision = list.iter().cloned().collect();
            assert_eq!(d, collected, "{n}");
            assert_eq!(d.policies(), &list[..], "{n}");
            assert_eq!(d.clone(), d, "{n}");
            assert_eq!(d.elapsed_by(Duration::ZERO).policies().len(), n, "{n}");
            assert_eq!(d.allowed(), n < 2, "{n}");
            assert_eq!(d.violated().count(), usize::from(n >= 2), "{n}");
            if n == 1 {
                let one = Decision::one(pd(0), Applied::Defaults, 0);
                assert_eq!(one, d);
            }
            // Admitted without a policy: without limit.
            assert_eq!(
                d.remaining(),
                if n == 0 {
                    u64::MAX
                } else {
                    10 - (n as u64 - 1)
                }
            );
        }
        assert!(Decision::unlimited(3).policies().is_empty());
        assert!(Decision::unconfigured_denied(3).policies().is_empty());
        assert_eq!(Decision::unconfigured_denied(3).remaining(), 0);
    }
}
