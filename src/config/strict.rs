//! A watch over serde's pass: whether `fields` would find anything in the file, told
//! without walking it, so that a valid file is parsed once, not twice.
//!
//! serde skips unknown fields and fills in required ones left out (`raw`'s placeholders);
//! this wrapper around the deserializer notes, and lets serde go on, a key a struct does
//! not know, a required field (the schema's `required`) a struct ends without, and a
//! mapping it loses sight of (an untagged enum buffers its value and reads it again out of
//! the wrapper's reach). The value is serde's own; a pass with nothing noted vouches that
//! the walk would report nothing, and after any note the walk is made (`parse`). The
//! wrapper never decides an error, so it can be unsure without changing what is reported.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde_json::Value;

thread_local! {
    /// Something the walk might report was seen since `deserialize` began on this thread.
    static NOTED: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    NOTED.with(|noted| noted.set(true));
}

/// `T` from `de`, as serde makes it, and whether the pass vouches that the `fields` walk
/// finds nothing in it.
pub(super) fn deserialize<'de, T: de::Deserialize<'de>, D: Deserializer<'de>>(de: D) -> Result<(T, bool), D::Error> {
    NOTED.with(|noted| noted.set(false));
    let value = T::deserialize(Strict(de))?;
    Ok((value, !NOTED.with(Cell::take)))
}

/// The fields of a struct (serde's list) that the schema requires, as a mask over that
/// list; `None` when no object of the schema has exactly these fields, or more than one
/// does with different requirements, or there are more than 64 fields.
fn required(fields: &'static [&'static str]) -> Option<u64> {
    thread_local! {
        // serde passes each struct's one static list: its address names the struct.
        static KNOWN: RefCell<HashMap<(usize, usize), Option<u64>>> = RefCell::new(HashMap::new());
    }
    let key = (fields.as_ptr() as usize, fields.len());
    if let Some(known) = KNOWN.with(|known| known.borrow().get(&key).copied()) {
        return known;
    }
    let mask = mask_of(fields);
    KNOWN.with(|known| known.borrow_mut().insert(key, mask));
    mask
}

fn mask_of(fields: &[&str]) -> Option<u64> {
    if fields.len() > 64 {
        return None;
    }
    let schema = super::fields::schema();
    let objects = schema.get("$defs").and_then(Value::as_object).into_iter().flat_map(|defs| defs.values());
    let mut found = None;
    for object in objects.chain([schema]) {
        let Some(properties) = object.get("properties").and_then(Value::as_object) else { continue };
        if properties.len() != fields.len() || !fields.iter().all(|f| properties.contains_key(*f)) {
            continue;
        }
        let required = object.get("required").and_then(Value::as_array).into_iter().flatten();
        let mut mask = 0;
        for name in required.filter_map(Value::as_str) {
            mask |= 1 << fields.iter().position(|f| *f == name)?;
        }
        if found.is_some_and(|other| other != mask) {
            return None;
        }
        found = Some(mask);
    }
    found
}

/// How a visitor's mapping is watched.
#[derive(Clone, Copy)]
enum Mode {
    /// A map (names as keys), or a value inside one: its keys are not fields.
    Plain,
    /// A value read through `deserialize_any`: a mapping here is beyond the wrapper.
    Any,
    /// A struct with these fields.
    Struct(&'static [&'static str]),
}

struct Strict<D>(D);

struct Wrap<V> {
    visitor: V,
    mode: Mode,
}

fn plain<V>(visitor: V) -> Wrap<V> {
    Wrap { visitor, mode: Mode::Plain }
}

macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(plain(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128 deserialize_f32
        deserialize_f64 deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Wrap { visitor, mode: Mode::Any })
    }

    /// A value serde skips: the value of a key no field takes.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        note();
        self.0.deserialize_ignored_any(visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, plain(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, plain(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, plain(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, plain(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, plain(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, Wrap { visitor, mode: Mode::Struct(fields) })
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! visit {
    ($($method:ident: $ty:ty)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    visit! {
        visit_bool: bool visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64 visit_i128: i128
        visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64 visit_u128: u128 visit_f32: f32
        visit_f64: f64 visit_char: char visit_str: &str visit_borrowed_str: &'de str visit_string: String
        visit_bytes: &[u8] visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Strict(de))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Strict(de))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if let Mode::Struct(_) = self.mode {
            // A struct written as a list: the walk says what of it.
            note();
        }
        self.visitor.visit_seq(Seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        match self.mode {
            Mode::Plain => self.visitor.visit_map(Map { map, fields: None }),
            Mode::Any => {
                note();
                self.visitor.visit_map(Map { map, fields: None })
            }
            Mode::Struct(fields) => {
                let mut given = 0;
                let value = self.visitor.visit_map(Map { map, fields: Some((fields, &mut given)) })?;
                if required(fields).is_none_or(|required| given & required != required) {
                    note();
                }
                Ok(value)
            }
        }
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Enum(data))
    }
}

/// A seed whose value is read through the wrapper.
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(de))
    }
}

struct Seq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Seq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct Map<'g, A> {
    map: A,
    /// A struct's fields, and the mask of those given so far.
    fields: Option<(&'static [&'static str], &'g mut u64)>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Map<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        match &mut self.fields {
            None => self.map.next_key_seed(Seed(seed)),
            Some((fields, given)) => self.map.next_key_seed(Key { seed, fields, given }),
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.map.next_value_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A struct's key: one of its fields (marked given), or noted.
struct Key<'g, S> {
    seed: S,
    fields: &'static [&'static str],
    given: &'g mut u64,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Key<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(KeyDeserializer { de, fields: self.fields, given: self.given })
    }
}

struct KeyDeserializer<'g, D> {
    de: D,
    fields: &'static [&'static str],
    given: &'g mut u64,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for KeyDeserializer<'_, D> {
    type Error = D::Error;

    /// How a derived struct reads its keys; any other way is not a field.
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_identifier(KeyVisitor { visitor, fields: self.fields, given: self.given })
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        note();
        self.de.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum ignored_any
    }
}

struct KeyVisitor<'g, V> {
    visitor: V,
    fields: &'static [&'static str],
    given: &'g mut u64,
}

impl<'de, V: Visitor<'de>> KeyVisitor<'_, V> {
    fn mark(&mut self, key: &str) {
        match self.fields.iter().position(|f| *f == key) {
            // Past 64 fields `required` knows nothing, and notes that.
            Some(field) if field < 64 => *self.given |= 1 << field,
            Some(_) => {}
            None => note(),
        }
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for KeyVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_str<E: de::Error>(mut self, key: &str) -> Result<V::Value, E> {
        self.mark(key);
        self.visitor.visit_str(key)
    }

    fn visit_borrowed_str<E: de::Error>(mut self, key: &'de str) -> Result<V::Value, E> {
        self.mark(key);
        self.visitor.visit_borrowed_str(key)
    }

    fn visit_string<E: de::Error>(mut self, key: String) -> Result<V::Value, E> {
        self.mark(&key);
        self.visitor.visit_string(key)
    }
}

struct Enum<A>(A);

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Enum<A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self::Variant), A::Error> {
        self.0.variant_seed(seed).map(|(value, variant)| (value, Variant(variant)))
    }
}

struct Variant<A>(A);

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, plain(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Wrap { visitor, mode: Mode::Struct(fields) })
    }
}

#[cfg(test)]
mod tests {
    use super::super::raw::RawConfig;
    use super::super::{fields, yaml_options};

    fn vouched(src: &str) -> bool {
        let parsed = serde_saphyr::with_deserializer_from_str_with_options(src, yaml_options(), |de| {
            super::deserialize::<RawConfig, _>(de)
        });
        parsed.expect("serde's value").1
    }

    #[test]
    fn a_file_whose_fields_are_all_known_and_given_is_vouched_for() {
        let src = "listen: 127.0.0.1:1\nserver: { idle_timeout: 5s }\nupstreams:\n  u: { servers: [\"127.0.0.1:2\"] }\nlimits:\n  a: { key: [ip, path], rate: 1r/s, window: 1m }\nroutes:\n  - { match: { path_prefix: /a, methods: [GET] }, limits: [a], upstream: u }\n  - respond: { status: 204 }\n";
        assert!(vouched(src));
        assert!(fields::check(src, "F").errors.is_empty());
    }

    /// Whatever the walk reports, or might: never vouched for.
    #[test]
    fn what_the_fields_walk_would_report_is_never_vouched_for() {
        for src in [
            "listen: 127.0.0.1:1\nservr: {}\n",
            "listen: 127.0.0.1:1\nroutes:\n  - { match: { hots: a } }\n",
            "listen: 127.0.0.1:1\nlimits:\n  a: { kye: ip, rate: 1r/s }\n",
            "listen: 127.0.0.1:1\nlimits:\n  a: { rate: 1r/s }\n",
            "routes: []\n",
            // Within an untagged enum's struct: beyond the wrapper's sight.
            "listen: [{ address: \"127.0.0.1:1\", tsl: {} }]\n",
            "listen: 127.0.0.1:1\nupstreams:\n  u: { servers: [{ address: \"127.0.0.1:2\", wieght: 2 }] }\n",
        ] {
            assert!(!vouched(src), "{src}");
        }
    }

    /// A mapping an untagged enum reads is not watched, even when it is right: the walk
    /// is made.
    #[test]
    fn a_mapping_read_by_an_untagged_enum_is_left_to_the_walk() {
        let src = "listen: [{ address: \"127.0.0.1:1\" }]\n";
        assert!(!vouched(src));
        assert!(fields::check(src, "F").errors.is_empty());
    }
}
