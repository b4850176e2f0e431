//! Reading a message's envelope in one pass of serde_json: each member the envelope reads at
//! most once (a duplicate is refused, as codex's serde-derived envelope refuses it); `params`
//! and `result` kept as a tree ([`Value`]) or as the line's own bytes ([`RawValue`]: skipped,
//! not copied); the other members checked as strictly as a [`Value`] parse would check them.

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{
    invalid, request_id, Envelope, EnvelopeError, ErrorResponse, Message, MessageKind,
    Notification, Request, RequestId, Response, RpcError,
};

/// The members the envelope reads, in the order of [`Member`].
const NAMES: [&str; 5] = ["id", "method", "params", "result", "error"];

/// The top-level members the envelope reads, each at most once. `P` is how `params` and
/// `result` are read: [`Value`] to keep them, [`RawValue`] to keep their bytes.
#[derive(Debug)]
pub(crate) struct Members<P> {
    id: Option<Value>,
    method: Option<Value>,
    params: Option<P>,
    result: Option<P>,
    error: Option<Value>,
    /// One bit a member of [`NAMES`] whose name was read (a cut line may end in its value),
    /// and one for each that came again.
    named: u8,
    again: u8,
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
            ..Members::default()
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

impl<'a> Members<&'a RawValue> {
    /// The envelope, with `params` and `result` as read whatever the kind.
    pub(crate) fn into_envelope(self) -> Result<Envelope<'a>, EnvelopeError> {
        let (params, result) = (self.params, self.result);
        let (kind, id, method) = match self.shape()? {
            Shape::Request { id, method, .. } => (MessageKind::Request, Some(id), Some(method)),
            Shape::Notification { method, .. } => (MessageKind::Notification, None, Some(method)),
            Shape::Response { id, .. } => (MessageKind::Response, Some(id), None),
            Shape::Error { id, .. } => (MessageKind::Error, id, None),
        };
        Ok(Envelope {
            kind,
            id,
            method,
            params,
            result,
        })
    }
}

impl<P> Default for Members<P> {
    fn default() -> Self {
        Members {
            id: None,
            method: None,
            params: None,
            result: None,
            error: None,
            named: 0,
            again: 0,
            not_an_object: false,
        }
    }
}

impl<P> Members<P> {
    /// The first member of [`NAMES`] that came twice.
    fn duplicate(&self) -> Option<&'static str> {
        (0..NAMES.len())
            .find(|bit| self.again & (1 << bit) != 0)
            .map(|bit| NAMES[bit])
    }

    fn shape(self) -> Result<Shape<P>, EnvelopeError> {
        if self.not_an_object {
            return Err(EnvelopeError::NotAnObject);
        }
        if let Some(member) = self.duplicate() {
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

    /// Who to answer in place of a line that is not a message (see
    /// [`crate::codec::decode_sender`]): its one `id`, as a request (it has a `method`,
    /// however malformed) or an answer (an `error` or `result` was named); its `method` when
    /// valid. `cut`: a line whose `method` is malformed names nobody.
    pub(crate) fn sender(self, cut: bool) -> Option<Envelope<'static>> {
        let method_ok = self.again & bit(Member::Method) == 0
            && matches!(self.method, None | Some(Value::String(_)));
        if (cut && !method_ok) || self.again & bit(Member::Id) != 0 {
            return None;
        }
        let id = request_id(self.id).ok().flatten();
        let kind = match &self.method {
            Some(_) => MessageKind::Request,
            None if self.named & bit(Member::Error) != 0 => MessageKind::Error,
            None if self.named & bit(Member::Result) != 0 => MessageKind::Response,
            None => return None,
        };
        let method = match self.method {
            Some(Value::String(method)) if method_ok => Some(method),
            _ => None,
        };
        Some(Envelope {
            kind,
            id: Some(id?),
            method,
            params: None,
            result: None,
        })
    }
}

/// The members serde_json's map visitor names (the first five in the order of [`NAMES`]).
#[derive(Clone, Copy, Deserialize)]
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

/// `member`'s bit in [`Members`]' `named` and `again`.
const fn bit(member: Member) -> u8 {
    1 << member as u8
}

/// The visitor methods of every JSON value but an object: each is checked (an array's
/// elements as [`Checked`]), then `$read` runs.
macro_rules! not_objects {
    ($self:ident, $read:block) => {
        fn visit_bool<E: de::Error>($self, _: bool) -> Result<Self::Value, E> {
            $read
        }

        fn visit_i64<E: de::Error>($self, _: i64) -> Result<Self::Value, E> {
            $read
        }

        fn visit_u64<E: de::Error>($self, _: u64) -> Result<Self::Value, E> {
            $read
        }

        fn visit_f64<E: de::Error>($self, _: f64) -> Result<Self::Value, E> {
            $read
        }

        fn visit_str<E: de::Error>($self, _: &str) -> Result<Self::Value, E> {
            $read
        }

        fn visit_unit<E: de::Error>($self) -> Result<Self::Value, E> {
            $read
        }

        fn visit_seq<A: SeqAccess<'de>>($self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<Checked>()?.is_some() {}
            $read
        }
    };
}

/// Reads [`Members`] from any JSON value (another value is checked whole: "not an object")
/// into the members given, which keep what was read before an error (a cut line's sender).
impl<'de, P: Deserialize<'de>> Visitor<'de> for &mut Members<P> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(member) = map.next_key::<Member>()? {
            self.again |= self.named & bit(member);
            self.named |= bit(member);
            if self.again & bit(member) != 0 {
                // Consumed, so that the rest of the line is still checked.
                map.next_value::<Checked>()?;
                continue;
            }
            match member {
                Member::Id => self.id = Some(map.next_value()?),
                Member::Method => self.method = Some(map.next_value()?),
                Member::Params => self.params = Some(map.next_value()?),
                Member::Result => self.result = Some(map.next_value()?),
                Member::Error => self.error = Some(map.next_value()?),
                Member::Other => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(())
    }

    not_objects!(self, {
        self.not_an_object = true;
        Ok(())
    });
}

/// Any JSON value, checked as [`Checked`] checks it, that also finds the first member name
/// that comes twice in one of its objects, at any depth (compared after unescaping, as codex's
/// reader compares them): where a reader keeps the last of them, a guard that read the first
/// would check what codex does not do.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unique {
    pub(crate) duplicate: Option<String>,
}

/// Read as a line's `params`: within the nesting a [`Value`] parse of the line allows (127
/// levels, the line's object one of them).
impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor(126))
    }
}

/// Reads a [`Unique`] with this many levels of nesting left.
#[derive(Clone, Copy)]
struct UniqueVisitor(u8);

impl UniqueVisitor {
    /// The visitor of the values in a container this one enters, if it may enter one.
    fn enter<E: de::Error>(self) -> Result<UniqueVisitor, E> {
        let left = self.0.checked_sub(1);
        left.map(UniqueVisitor)
            .ok_or_else(|| E::custom("recursion limit exceeded"))
    }
}

impl<'de> de::DeserializeSeed<'de> for UniqueVisitor {
    type Value = Unique;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Unique, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let (mut found, values) = (Unique::default(), self.enter()?);
        // Objects hold few members: a list compares faster than a set would hash.
        let mut names: Vec<std::borrow::Cow<'de, str>> = Vec::new();
        while let Some(name) = map.next_key_seed(NameSeed)? {
            let inner = map.next_value_seed(values)?;
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
        let (mut found, values) = (Unique::default(), self.enter()?);
        while let Some(inner) = seq.next_element_seed(values)? {
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
struct Checked;

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

    not_objects!(self, { Ok(Checked) });
}
