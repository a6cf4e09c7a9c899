//! The JSON summary: top-level type, member or element count, and the first
//! keys, read from the kept prefix without building a value tree.
//!
//! A `serde_json::Value` of a 4 MiB `[{"a":0},...]` is over 300 MiB (a
//! B-tree node per object; issue 15). Here serde_json only validates and
//! skips (`IgnoredAny` walks nested values with an explicit stack, not
//! recursion), the visitor counts the top level and keeps the
//! [`KEYS`] smallest keys, each cut to [`KEY_STORE`] bytes: memory beyond
//! the input is one unescaped string (serde_json's scratch) and that list.
//! The deadline is checked every 1024 top-level values.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::budget::Deadline;
use crate::result::Summary;

/// Keys listed, and bytes of each kept for sorting.
const KEYS: usize = 50;
const KEY_STORE: usize = 256;
const KEY_CHARS: usize = 64;
/// Top-level values between looks at the clock (a power of two).
const CHECK_EVERY: u64 = 1024;

/// What reading the prefix gave.
#[derive(Debug, PartialEq)]
pub(super) enum Outcome {
    /// A whole object or array.
    Summary(Summary),
    /// Not JSON after all (or a scalar at the top).
    NotJson,
    /// The deadline passed; what the first byte promised.
    Stopped(Summary),
}

/// Summarise `text`, the whole file.
pub(super) fn summarise(text: &[u8], deadline: Deadline) -> Outcome {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    let stopped = Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(text);
    let top = de.deserialize_any(Top { deadline, stopped: &stopped }).and_then(|t| de.end().map(|()| t));
    match top {
        Ok(Some(s)) => Outcome::Summary(s),
        _ if stopped.get() => Outcome::Stopped(promised(text).unwrap_or_else(|| partial("array"))),
        _ => Outcome::NotJson,
    }
}

/// For a file too large to parse (or a parse cut short): what its first
/// byte promises, `None` when it promises neither an object nor an array.
pub(super) fn promised(kept: &[u8]) -> Option<Summary> {
    let text = kept.strip_prefix(b"\xef\xbb\xbf").unwrap_or(kept);
    match text.iter().find(|b| !b.is_ascii_whitespace())? {
        b'{' => Some(partial("object")),
        b'[' => Some(partial("array")),
        _ => None,
    }
}

fn partial(top: &str) -> Summary {
    Summary::Json { top_level: top.into(), length: None, keys: vec![], partial: true }
}

struct Top<'a> {
    deadline: Deadline,
    stopped: &'a Cell<bool>,
}

impl Top<'_> {
    fn check<E: de::Error>(&self, n: u64) -> Result<(), E> {
        if n & (CHECK_EVERY - 1) == 0 && self.deadline.passed() {
            self.stopped.set(true);
            return Err(E::custom("time budget"));
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    /// `None` for a scalar at the top level (not what we summarise).
    type Value = Option<Summary>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut n = 0u64;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
            self.check(n)?;
        }
        Ok(Some(Summary::Json { top_level: "array".into(), length: Some(n), keys: vec![], partial: false }))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut keys = BTreeSet::new();
        let mut n = 0u64;
        while map.next_key_seed(Key(&mut keys))?.is_some() {
            map.next_value::<IgnoredAny>()?;
            n += 1;
            self.check(n)?;
        }
        let keys = keys.iter().map(|(k, _)| super::text::printable(k, KEY_CHARS)).collect();
        Ok(Some(Summary::Json { top_level: "object".into(), length: Some(n), keys, partial: false }))
    }
}

/// A kept key: its first [`KEY_STORE`] bytes and, so that two long keys
/// with the same prefix stay two (as in a map), a hash of the whole key.
type Kept = (String, u64);

/// A key, kept when among the [`KEYS`] smallest.
struct Key<'a>(&'a mut BTreeSet<Kept>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<(), E> {
        let mut end = key.len().min(KEY_STORE);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        let whole = if end == key.len() {
            0
        } else {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(key, &mut h);
            std::hash::Hasher::finish(&h)
        };
        let kept = (key[..end].to_string(), whole);
        if self.0.len() < KEYS || self.0.last().is_some_and(|last| &kept < last) {
            self.0.insert(kept);
            if self.0.len() > KEYS {
                self.0.pop_last();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn summary(text: &[u8]) -> Outcome {
        summarise(text, Deadline::from_now())
    }

    #[test]
    fn objects_and_arrays_are_counted_and_keys_listed_sorted() {
        let s = summary(br#"{"b": 1, "a": [1, 2], "c": {"d": null}}"#);
        let keys = vec!["a".to_string(), "b".into(), "c".into()];
        assert_eq!(s, Outcome::Summary(Summary::Json { top_level: "object".into(), length: Some(3), keys, partial: false }));
        let s = summary(b"\xef\xbb\xbf [1, [2, 3], {}] \n");
        assert_eq!(
            s,
            Outcome::Summary(Summary::Json { top_level: "array".into(), length: Some(3), keys: vec![], partial: false })
        );
        assert_eq!(summary(b"{not json"), Outcome::NotJson);
        assert_eq!(summary(b"[1] trailing"), Outcome::NotJson);
        assert_eq!(summary(b"42"), Outcome::NotJson);
    }

    #[test]
    fn only_the_smallest_keys_are_kept_and_each_is_cut() {
        let long = "z".repeat(10_000);
        let members: Vec<String> = (0..500).rev().map(|i| format!("\"k{i:03}\": 0")).chain([format!("\"{long}\": 1")]).collect();
        let text = format!("{{{}}}", members.join(","));
        let Outcome::Summary(Summary::Json { length, keys, .. }) = summary(text.as_bytes()) else {
            panic!()
        };
        assert_eq!(length, Some(501));
        assert_eq!(keys.len(), KEYS);
        assert_eq!(keys[0], "k000");
        assert_eq!(keys[49], "k049");
        // Long keys alike in their first bytes are still told apart.
        let (a, b) = ("x".repeat(300) + "a", "x".repeat(300) + "b");
        let text = format!("{{\"{a}\": 1, \"{b}\": 2, \"{a}\": 3}}");
        let Outcome::Summary(Summary::Json { length, keys, .. }) = summary(text.as_bytes()) else {
            panic!()
        };
        assert_eq!((length, keys.len()), (Some(3), 2));
    }

    #[test]
    fn deep_nesting_is_walked_without_recursion() {
        let depth = 1 << 20;
        let text = [vec![b'['; depth], vec![b']'; depth]].concat();
        let Outcome::Summary(Summary::Json { length, .. }) = summary(&text) else { panic!() };
        assert_eq!(length, Some(1));
    }

    #[test]
    fn a_passed_deadline_stops_the_count_and_says_so() {
        let text = [b"[".to_vec(), b"0,".repeat(5000), b"0]".to_vec()].concat();
        assert_eq!(summarise(&text, Deadline::at(Instant::now())), Outcome::Stopped(partial("array")));
        assert_eq!(promised(b"  {\"a\""), Some(partial("object")));
        assert_eq!(promised(b"nope"), None);
    }
}
