//! Reading a message's envelope in one pass of serde_json: each member the envelope reads at
//! most once (a duplicate is refused, as codex's serde-derived envelope refuses it), the rest
//! checked as strictly as a [`Value`] parse would check it.

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{
    invalid, request_id, Envelope, EnvelopeError, ErrorResponse, Message, MessageKind,
    Notification, Request, RequestId, Response, RpcError,
};

/// The top-level members the envelope reads, each at most once. `P` is how `params` and
/// `result` are read: [`Value`] to keep them, [`Checked`] to check them without keeping them.
#[derive(Debug)]
pub(crate) struct Members<P> {
    id: Option<Value>,
    method: Option<Value>,
    params: Option<P>,
    result: Option<P>,
    error: Option<Value>,
    /// The first member that came twice.
    duplicate: Option<&'static str>,
    not_an_object: bool,
}

/// [`Message`] with payloads of type `P`.
enum Shape<P> {
    Request {
        id: RequestId,
        method: String,
        params: Option<P>,
    },
    Notification {
        method: String,
        params: Option<P>,
    },
    Response {
        id: RequestId,
        result: P,
    },
    Error {
        id: Option<RequestId>,
        error: RpcError,
    },
}

impl Members<Value> {
    /// The members of an object already parsed (which kept one of any duplicates).
    pub(crate) fn from_object(mut object: serde_json::Map<String, Value>) -> Self {
        Members {
            id: object.remove("id"),
            method: object.remove("method"),
            params: object.remove("params"),
            result: object.remove("result"),
            error: object.remove("error"),
            ..Members::none(false)
        }
    }

    pub(crate) fn into_message(self) -> Result<Message, EnvelopeError> {
        Ok(match self.shape()? {
            Shape::Request { id, method, params } => {
                Message::Request(Request { id, method, params })
            }
            Shape::Notification { method, params } => {
                Message::Notification(Notification { method, params })
            }
            Shape::Response { id, result } => Message::Response(Response { id, result }),
            Shape::Error { id, error } => Message::Error(ErrorResponse { id, error }),
        })
    }
}

impl<P> Members<P> {
    fn none(not_an_object: bool) -> Self {
        Members {
            id: None,
            method: None,
            params: None,
            result: None,
            error: None,
            duplicate: None,
            not_an_object,
        }
    }

    fn shape(self) -> Result<Shape<P>, EnvelopeError> {
        if self.not_an_object {
            return Err(EnvelopeError::NotAnObject);
        }
        if let Some(member) = self.duplicate {
            return Err(EnvelopeError::DuplicateMember { member });
        }
        let id = request_id(self.id)?;
        let params = self.params;
        if let Some(method) = self.method {
            let Value::String(method) = method else {
                return Err(invalid("method", "not a string"));
            };
            return Ok(match id {
                Some(id) => Shape::Request { id, method, params },
                None => Shape::Notification { method, params },
            });
        }
        if let Some(error) = self.error {
            let error =
                RpcError::deserialize(error).map_err(|e| invalid("error", &e.to_string()))?;
            return Ok(Shape::Error { id, error });
        }
        if let Some(result) = self.result {
            let id = id.ok_or(EnvelopeError::ResponseWithoutId)?;
            return Ok(Shape::Response { id, result });
        }
        Err(EnvelopeError::NoKind)
    }

    pub(crate) fn into_envelope(self) -> Result<Envelope, EnvelopeError>
    where
        P: Duplicates,
    {
        if let Some(member) = self.params.as_ref().and_then(Duplicates::duplicate) {
            if self.duplicate.is_none() && !self.not_an_object {
                let member = member.to_string();
                return Err(EnvelopeError::DuplicateInParams { member });
            }
        }
        let (kind, id, method) = match self.shape()? {
            Shape::Request { id, method, .. } => (MessageKind::Request, Some(id), Some(method)),
            Shape::Notification { method, .. } => (MessageKind::Notification, None, Some(method)),
            Shape::Response { id, .. } => (MessageKind::Response, Some(id), None),
            Shape::Error { id, .. } => (MessageKind::Error, id, None),
        };
        Ok(Envelope { kind, id, method })
    }
}

/// The members serde_json's map visitor names.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Member {
    Id,
    Method,
    Params,
    Result,
    Error,
    #[serde(other)]
    Other,
}

/// Reads [`Members`] from any JSON value (another value is checked whole: "not an object").
pub(crate) struct MembersVisitor<P>(std::marker::PhantomData<P>);

impl<P> MembersVisitor<P> {
    pub(crate) fn new() -> Self {
        MembersVisitor(std::marker::PhantomData)
    }
}

/// Stores the first occurrence of a member; a second one is consumed (so the rest of the line
/// is still checked) and remembered as the duplicate.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    slot: &mut Option<T>,
    name: &'static str,
    duplicate: &mut Option<&'static str>,
    map: &mut A,
) -> Result<(), A::Error> {
    if slot.is_some() {
        map.next_value::<Checked>()?;
        duplicate.get_or_insert(name);
    } else {
        *slot = Some(map.next_value()?);
    }
    Ok(())
}

/// The visitor methods of every JSON value but an object: each is checked (an array's
/// elements as [`Checked`]) and read as `$value`.
macro_rules! not_objects {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<Checked>()?.is_some() {}
            Ok($value)
        }
    };
}

impl<'de, P: Deserialize<'de>> Visitor<'de> for MembersVisitor<P> {
    type Value = Members<P>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<P>, A::Error> {
        let mut members = Members::none(false);
        let duplicate = &mut members.duplicate;
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                Member::Id => once(&mut members.id, "id", duplicate, &mut map)?,
                Member::Method => once(&mut members.method, "method", duplicate, &mut map)?,
                Member::Params => once(&mut members.params, "params", duplicate, &mut map)?,
                Member::Result => once(&mut members.result, "result", duplicate, &mut map)?,
                Member::Error => once(&mut members.error, "error", duplicate, &mut map)?,
                Member::Other => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(members)
    }

    not_objects!(Members::none(true));
}

/// A payload that may have seen a member name twice in one of its objects.
pub(crate) trait Duplicates {
    /// The first member name seen twice in one object, if any.
    fn duplicate(&self) -> Option<&str>;
}

impl Duplicates for Checked {
    fn duplicate(&self) -> Option<&str> {
        None
    }
}

/// Any JSON value, checked as [`Checked`] checks it, that also finds the first member name
/// that comes twice in one of its objects, at any depth (compared after unescaping, as codex's
/// reader compares them): where a reader keeps the last of them, a guard that read the first
/// would check what codex does not do.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unique {
    duplicate: Option<String>,
}

impl Duplicates for Unique {
    fn duplicate(&self) -> Option<&str> {
        self.duplicate.as_deref()
    }
}

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut found = Unique::default();
        // Objects hold few members: a list compares faster than a set would hash.
        let mut names: Vec<std::borrow::Cow<'de, str>> = Vec::new();
        while let Some(name) = map.next_key_seed(NameSeed)? {
            let inner: Unique = map.next_value()?;
            if found.duplicate.is_none() {
                if names.contains(&name) {
                    found.duplicate = Some(name.into_owned());
                } else {
                    found.duplicate = inner.duplicate;
                    names.push(name);
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        let mut found = Unique::default();
        while let Some(inner) = seq.next_element::<Unique>()? {
            if found.duplicate.is_none() {
                found.duplicate = inner.duplicate;
            }
        }
        Ok(found)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Unique, E> {
        Ok(Unique::default())
    }
}

/// A member name, borrowed from the line unless it holds escapes.
struct NameSeed;

impl<'de> de::DeserializeSeed<'de> for NameSeed {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E: de::Error>(self, name: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(name))
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(name.to_string()))
    }
}

/// Any JSON value, checked exactly as strictly as parsing it into a [`Value`] would (numbers in
/// range, escapes decoded, the nesting limit) but kept nowhere. serde's `IgnoredAny` is more
/// lenient (it accepts `1e999` and lone surrogates), which a `Value` reader, codex's included,
/// refuses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }

    not_objects!(Checked);
}
