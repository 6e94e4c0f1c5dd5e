//! The storage under the [`Index`](super::Index): one kind's entries, looked up by key and
//! kept per watch scope through its lists, and the rows of a secondary index. Apart from the
//! index because neither knows which kind it holds or what a change of it affects.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use super::{Cached, Scope};
use crate::decide::facts::ObjectKey;
use crate::decide::linking::Found;

/// One kind's entries, each stored under its own key: a map from key to entry would hold every
/// key twice.
#[derive(Debug)]
pub struct Table<E> {
    pub(super) items: HashSet<Keyed<E>>,
    /// Scopes that have not finished their first list.
    pub(super) unsynced: HashSet<Scope>,
    /// Scopes whose kind is not served where it can be read, and why: nothing in them is
    /// known (an owner kind's, [`Update::Unserved`]).
    pub(super) unknown: HashMap<Scope, String>,
    pub(super) relists: HashMap<Scope, HashSet<Keyed<E>>>,
}

/// An entry that hashes and compares as its key, so a set of them is looked up by key.
#[derive(Debug)]
pub(super) struct Keyed<E>(pub(super) E);

impl<E: Cached> Borrow<ObjectKey> for Keyed<E> {
    fn borrow(&self) -> &ObjectKey {
        self.0.key()
    }
}

impl<E: Cached> Hash for Keyed<E> {
    // As the key hashes, which `Borrow` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

impl<E: Cached> PartialEq for Keyed<E> {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl<E: Cached> Eq for Keyed<E> {}

impl<E> Table<E> {
    pub(super) fn new(scopes: &[Scope]) -> Self {
        Self {
            items: HashSet::new(),
            unsynced: scopes.iter().cloned().collect(),
            unknown: HashMap::new(),
            relists: HashMap::new(),
        }
    }

    pub(super) fn synced(&self) -> bool {
        self.unsynced.is_empty()
    }

    /// Why nothing of this kind is known in `namespace`, if so: its scope is unknown.
    pub(super) fn unknown_in(&self, namespace: &str) -> Option<&str> {
        (self.unknown.iter())
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))
            .map(|(_, why)| why.as_str())
    }

    /// What the table says of the kind in `namespace` as a whole: unknown until listed, or
    /// while not served where it can be read.
    pub(super) fn known_in(&self, namespace: &str, what: &str) -> Result<(), String> {
        if !self.synced() {
            return Err(format!("the {what} cache has not synced yet"));
        }
        match self.unknown_in(namespace) {
            Some(why) => Err(why.to_owned()),
            None => Ok(()),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &E> {
        self.items.iter().map(|entry| &entry.0)
    }
}

impl<E: Cached> Table<E> {
    pub(super) fn entry(&self, key: &ObjectKey) -> Option<&E> {
        self.items.get(key).map(|entry| &entry.0)
    }

    pub(super) fn get(&self, key: &ObjectKey, what: &str) -> Found<E> {
        if let Err(why) = self.known_in(&key.namespace, what) {
            return Found::Unknown(why);
        }
        self.entry(key).cloned().map_or(Found::No, Found::Yes)
    }
}

/// One row of a secondary index: a sorted set with no spare capacity. A row holds one or two
/// values (a claim's pods, the runs binding it), and there is a row per claim: a `BTreeSet`
/// would allocate a whole node (eleven slots) for each, a `Vec` its growth headroom.
pub(super) type Row<V> = Box<[V]>;

/// Adds or removes `value` under `key`, dropping empty rows so the maps do not grow forever.
/// Rows change only when an object's links do, so re-allocating a row each time costs little.
pub(super) fn set_row<K, V>(map: &mut HashMap<K, Row<V>>, key: K, value: V, add: bool)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if add {
        let row = map.entry(key).or_default();
        if let Err(at) = row.binary_search(&value) {
            let mut values = std::mem::take(row).into_vec();
            values.insert(at, value);
            *row = values.into_boxed_slice();
        }
    } else if let Some(row) = map.get_mut(&key)
        && let Ok(at) = row.binary_search(&value)
    {
        let mut values = std::mem::take(row).into_vec();
        values.remove(at);
        if values.is_empty() {
            map.remove(&key);
        } else {
            *row = values.into_boxed_slice();
        }
    }
}
