//! Reading a JSON value leniently: as a `T` where it has `T`'s shape, and as `Absent` or `Odd`
//! otherwise, never as an error, skipping what is not read without allocating it. Apart from
//! the owner types that read this way (`mod.rs`) because it knows nothing of Kubernetes.

use std::fmt;

use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON value read as a `T` where it has `T`'s shape, and never an error: `null` or absent is
/// `Absent`, a value of another shape `Odd` (skipped, not allocated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Shape<T> {
    #[default]
    Absent,
    Is(T),
    Odd,
}

impl<T> Shape<T> {
    pub(super) fn get(&self) -> Option<&T> {
        match self {
            Shape::Is(value) => Some(value),
            Shape::Absent | Shape::Odd => None,
        }
    }
}

/// What a [`Shape`] reads: the JSON values of `T`'s shape. Each reader consumes its value and
/// answers `None` when it does not have the shape.
pub(super) trait Shaped: Sized {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn from_str(_: &str) -> Option<Self> {
        None
    }
}

impl Shaped for String {
    fn from_str(text: &str) -> Option<Self> {
        Some(text.to_owned())
    }
}

impl<T: Shaped> Shaped for Vec<Shape<T>> {
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Some(items))
    }
}

impl<'de, T: Shaped> Deserialize<'de> for Shape<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(std::marker::PhantomData))
    }
}

struct ShapeVisitor<T>(std::marker::PhantomData<T>);

fn shaped<T>(value: Option<T>) -> Shape<T> {
    value.map_or(Shape::Odd, Shape::Is)
}

impl<'de, T: Shaped> Visitor<'de> for ShapeVisitor<T> {
    type Value = Shape<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::from_map(map).map(shaped)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::from_seq(seq).map(shaped)
    }

    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(shaped(T::from_str(text)))
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Shape::Absent)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Shape::Absent)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Shape::Odd)
    }
}

/// Reads the entries of a JSON object named in `names` with `read`, which is given the name
/// and must consume the value; every other entry is skipped unallocated. A name given twice:
/// the last value wins.
pub(super) fn fields<'de, A: MapAccess<'de>>(
    mut map: A,
    names: &'static [&'static str],
    mut read: impl FnMut(&'static str, &mut A) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    while let Some(name) = map.next_key_seed(FieldName(names))? {
        match name {
            Some(name) => read(name, &mut map)?,
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(())
}

/// A key of a JSON object, as the one of the names it is, if any (compared, not allocated).
struct FieldName(&'static [&'static str]);

impl<'de> serde::de::DeserializeSeed<'de> for FieldName {
    type Value = Option<&'static str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().copied().find(|name| *name == key))
    }
}

/// Implements [`Shaped`] for a struct read from a JSON object: each listed field from its
/// JSON name, as a [`Shape`] (absent ones stay `Absent`).
macro_rules! shaped_struct {
    ($name:ident { $($field:ident: $json:literal),* $(,)? }) => {
        impl Shaped for $name {
            fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
                let mut value = Self::default();
                fields(map, &[$($json),*], |name, map| {
                    match name {
                        $($json => value.$field = map.next_value()?,)*
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(())
                })?;
                Ok(Some(value))
            }
        }
    };
}
pub(super) use shaped_struct;
