//! A list that holds one element without allocating: most checks have one policy.

/// Zero, one (inline) or several (on the heap) elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Few<T> {
    None,
    One(T),
    Many(Vec<T>),
}

impl<T> Few<T> {
    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Few::None => &[],
            Few::One(t) => std::slice::from_ref(t),
            Few::Many(v) => v,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Few::None => &mut [],
            Few::One(t) => std::slice::from_mut(t),
            Few::Many(v) => v,
        }
    }

    pub(crate) fn from_vec(mut v: Vec<T>) -> Self {
        match v.len() {
            0 => Few::None,
            1 => v.pop().map_or(Few::None, Few::One),
            _ => Few::Many(v),
        }
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Few::None;
        };
        let Some(second) = iter.next() else {
            return Few::One(first);
        };
        let mut v = Vec::with_capacity(2 + iter.size_hint().0);
        v.push(first);
        v.push(second);
        v.extend(iter);
        Few::Many(v)
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = FewIter<T>;

    fn into_iter(self) -> FewIter<T> {
        match self {
            Few::None => FewIter::Vec(Vec::new().into_iter()),
            Few::One(t) => FewIter::One(Some(t)),
            Few::Many(v) => FewIter::Vec(v.into_iter()),
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
