//! How a request body is read: as the contract types it, with PATCH
//! semantics for absent and `null` keys ([`nullable`], [`present`]).
//!
//! Request bodies read as the contract types them. serde's derive is
//! lenient in two ways a contract is not: a struct also deserializes from
//! a JSON array (its fields by position, so `["https://…"]` would set a
//! webhook's `url`), and an `Option` field takes `null` whether or not the
//! field is nullable. [`Strict`] wraps a deserializer so that, at every
//! depth, an object is only read from a JSON object and `null` is refused
//! except where a field is declared nullable with [`or_null`] (or
//! [`nullable`] for PATCH bodies).
//!
//! Outside [`Strict`] (stored items, tests that call `serde_json` directly)
//! the marked fields behave like plain `Option`s.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, Expected, MapAccess, SeqAccess, Visitor};

/// The newtype name [`or_null`] asks for; [`Strict`] lets `null` through
/// for the value inside it.
const NULLABLE: &str = "$dhukuti::nullable";

/// A deserializer that refuses arrays for structs and `null` for fields
/// not declared nullable, at every depth.
pub struct Strict<D> {
    inner: D,
    allow_null: bool,
}

impl<D> Strict<D> {
    pub fn new(inner: D) -> Self {
        Strict {
            inner,
            allow_null: false,
        }
    }
}

/// For `#[serde(default, deserialize_with = "or_null")]` on an `Option<T>`
/// the contract types "or null": absent and `null` are both `None`.
pub fn or_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: de::Deserialize<'de>,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a value or null")
        }
        fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            <Option<T> as de::Deserialize>::deserialize(d)
        }
    }
    d.deserialize_newtype_struct(NULLABLE, V(PhantomData))
}

/// For `#[serde(default, deserialize_with = "nullable")]` on an
/// `Option<Option<T>>`: `None` = not sent, `Some(None)` = sent as `null`
/// (PATCH bodies where `null` clears a field).
pub fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: de::Deserialize<'de>,
{
    or_null(d).map(Some)
}

/// For `#[serde(default, deserialize_with = "present")]` on an
/// `Option<T>` that cannot be cleared: absent is `None`, `null` is refused
/// (a 400 naming the field, never a silent no-op).
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: de::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Wraps the visitor of a value: whatever it reads inside is strict again.
struct Inner<V>(V);

/// Wraps the visitor of a struct: only a JSON object will do.
struct Object<V>(V);

/// Wraps the visitor of a non-nullable `Option`: `null` is refused.
struct NotNull<V>(V);

macro_rules! forward_scalars {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.0.$method(v)
            }
        )*
    };
}

/// The visits every wrapper passes on unchanged (scalars) or re-wraps
/// (containers).
macro_rules! visitor_body {
    () => {
        type Value = V::Value;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            self.0.expecting(f)
        }

        forward_scalars! {
            visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64),
            visit_i128(i128), visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64),
            visit_u128(u128), visit_f32(f32), visit_f64(f64), visit_char(char),
            visit_str(&str), visit_borrowed_str(&'de str), visit_string(String),
            visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            self.0.visit_unit()
        }

        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            self.0.visit_some(Strict::new(d))
        }

        fn visit_newtype_struct<D2: Deserializer<'de>>(
            self,
            d: D2,
        ) -> Result<Self::Value, D2::Error> {
            self.0.visit_newtype_struct(Strict::new(d))
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            self.0.visit_map(StrictMap(map))
        }

        fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
            self.0.visit_enum(data)
        }
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Inner<V> {
    visitor_body!();

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(StrictSeq(seq))
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Object<V> {
    visitor_body!();

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<Self::Value, A::Error> {
        Err(de::Error::invalid_type(de::Unexpected::Seq, &AnObject))
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for NotNull<V> {
    visitor_body!();

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(E::custom(
            "null is not allowed here: send a value or leave the field out",
        ))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(StrictSeq(seq))
    }
}

struct AnObject;

impl Expected for AnObject {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
}

struct StrictSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for StrictSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct StrictMap<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(seed)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct StrictSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict::new(d))
    }
}

macro_rules! forward_inner {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method(Inner(visitor))
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward_inner! {
        deserialize_any, deserialize_bool, deserialize_i8, deserialize_i16, deserialize_i32,
        deserialize_i64, deserialize_i128, deserialize_u8, deserialize_u16, deserialize_u32,
        deserialize_u64, deserialize_u128, deserialize_f32, deserialize_f64, deserialize_char,
        deserialize_str, deserialize_string, deserialize_bytes, deserialize_byte_buf,
        deserialize_unit, deserialize_seq, deserialize_map, deserialize_identifier,
        deserialize_ignored_any,
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        if self.allow_null {
            self.inner.deserialize_option(Inner(visitor))
        } else {
            self.inner.deserialize_option(NotNull(visitor))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_unit_struct(name, Inner(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        if name == NULLABLE {
            return visitor.visit_newtype_struct(Strict {
                inner: self.inner,
                allow_null: true,
            });
        }
        self.inner.deserialize_newtype_struct(name, Inner(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple(len, Inner(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_tuple_struct(name, len, Inner(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_struct(name, fields, Object(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_enum(name, variants, Inner(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Body {
        url: Option<String>,
        #[serde(default)]
        inner: Option<Inner2>,
        #[serde(default, deserialize_with = "or_null")]
        note: Option<String>,
        #[serde(default)]
        tags: Option<Vec<Inner2>>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner2 {
        name: String,
    }

    fn strict(text: &str) -> Result<Body, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        Body::deserialize(Strict::new(&mut de)).map_err(|e| e.to_string())
    }

    #[test]
    fn objects_only_from_objects() {
        assert!(strict(r#"["https://x"]"#).is_err());
        assert!(strict(r#"{"inner": ["n"]}"#).is_err());
        assert!(strict(r#"{"tags": [["n"]]}"#).is_err());
        assert_eq!(
            strict(r#"{"url": "https://x", "inner": {"name": "n"}, "tags": [{"name": "t"}]}"#),
            Ok(Body {
                url: Some("https://x".into()),
                inner: Some(Inner2 { name: "n".into() }),
                note: None,
                tags: Some(vec![Inner2 { name: "t".into() }]),
            })
        );
        // The lenient derive, for comparison: what Strict is for.
        assert!(serde_json::from_str::<Inner2>(r#"["n"]"#).is_ok());
    }

    #[test]
    fn null_only_where_declared() {
        let e = strict(r#"{"url": null}"#).unwrap_err();
        assert!(e.contains("null is not allowed"), "{e}");
        assert!(strict(r#"{"inner": null}"#).is_err());
        assert!(strict(r#"{"tags": null}"#).is_err());
        assert_eq!(strict(r#"{"note": null}"#).map(|b| b.note), Ok(None));
        assert_eq!(
            strict(r#"{"note": "hi"}"#).map(|b| b.note),
            Ok(Some("hi".into()))
        );
        // Absent is fine everywhere; outside Strict, null stays lenient.
        assert!(strict("{}").is_ok());
        assert!(serde_json::from_str::<Body>(r#"{"url": null, "note": null}"#).is_ok());
    }
}
