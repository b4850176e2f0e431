//! The part of an oversized line that its reader needs: the line with one array emptied
//! ([`LineFramer::eliding`](crate::codec::LineFramer::eliding)).

/// Streams one JSON text and copies it with the array at `path` (member names, from the
/// top-level object down) left empty, as long as the copy stays within `limit` bytes. Only
/// the structure is tracked (strings, nesting, names along the path), so memory is the copy
/// alone. Names are compared as written (an escaped one never matches); input that is not JSON
/// gives a copy that is not JSON either, for the caller's parser to refuse.
#[derive(Debug, Clone)]
pub(crate) struct Elider {
    path: &'static [&'static str],
    limit: usize,
    out: Vec<u8>,
    overflowed: bool,
    /// A `\r` outside strings, not copied until something follows it: the framer may hand
    /// over the `\r` of a line's `\r\n` before it knows the line ends there.
    cr: bool,
    /// Objects entered along the path: the top-level object, then one per name matched.
    on_path: usize,
    /// Containers entered inside the innermost path object that are not on the path.
    off_path: usize,
    /// Containers entered inside the array being emptied, itself included (0: not in one).
    emptied: usize,
    string: Str,
    /// Where the scan is among the members of the innermost path object.
    member: Member,
}

#[derive(Debug, Clone, Copy)]
enum Str {
    Outside,
    Inside,
    /// Right after a backslash inside a string.
    Escaped,
}

#[derive(Debug, Clone, Copy)]
enum Member {
    /// A name comes next (after `{` or `,`).
    Name,
    /// Reading a name: bytes so far, and whether they still spell the path's next name.
    Reading { at: usize, matches: bool },
    /// A value comes (or came) next: whether its name was the path's next one.
    Value { matched: bool },
}

impl Elider {
    pub(crate) fn new(path: &'static [&'static str], limit: usize) -> Self {
        Elider {
            path,
            limit,
            out: Vec::new(),
            overflowed: false,
            cr: false,
            on_path: 0,
            off_path: 0,
            emptied: 0,
            string: Str::Outside,
            member: Member::Value { matched: false },
        }
    }

    /// Whether the copy has passed the limit (what follows is then ignored).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Reads the next bytes of the text.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.overflowed {
                return;
            }
            let copied = self.emptied == 0;
            let outside = matches!(self.string, Str::Outside);
            self.step(byte);
            // The emptied array's own brackets are kept: `[` before it, `]` after it.
            if copied || self.emptied == 0 {
                if std::mem::take(&mut self.cr) {
                    self.copy(b'\r');
                }
                if byte == b'\r' && outside {
                    self.cr = true;
                } else {
                    self.copy(byte);
                }
            }
        }
    }

    fn copy(&mut self, byte: u8) {
        if self.out.len() == self.limit {
            self.overflowed = true;
        } else if !self.overflowed {
            self.out.push(byte);
        }
    }

    /// The copy, unless it passed the limit (a `\r` it ends with is left out).
    pub(crate) fn finish(self) -> Option<Vec<u8>> {
        (!self.overflowed).then_some(self.out)
    }

    /// The next name along the path, when the innermost path object has one.
    fn target(&self) -> Option<&'static str> {
        self.on_path
            .checked_sub(1)
            .and_then(|at| self.path.get(at).copied())
    }

    fn step(&mut self, byte: u8) {
        let in_name = self.emptied == 0 && self.off_path == 0;
        match self.string {
            Str::Escaped => {
                self.string = Str::Inside;
                return;
            }
            Str::Inside => {
                match byte {
                    b'\\' => {
                        self.string = Str::Escaped;
                        if let (true, Member::Reading { matches, .. }) = (in_name, &mut self.member)
                        {
                            *matches = false;
                        }
                    }
                    b'"' => {
                        self.string = Str::Outside;
                        if let (true, Member::Reading { at, matches }) = (in_name, self.member) {
                            let target = self.target().unwrap_or_default();
                            self.member = Member::Value {
                                matched: matches && at == target.len(),
                            };
                        }
                    }
                    _ if in_name => {
                        let target = self.target().unwrap_or_default().as_bytes();
                        if let Member::Reading { at, matches } = &mut self.member {
                            *matches &= target.get(*at) == Some(&byte);
                            *at += 1;
                        }
                    }
                    _ => {}
                }
                return;
            }
            Str::Outside => {}
        }
        if byte == b'"' {
            self.string = Str::Inside;
            if in_name && self.on_path > 0 && matches!(self.member, Member::Name) {
                self.member = Member::Reading {
                    at: 0,
                    matches: true,
                };
            }
            return;
        }
        if self.emptied > 0 {
            match byte {
                b'[' | b'{' => self.emptied += 1,
                b']' | b'}' => self.emptied -= 1,
                _ => {}
            }
            return;
        }
        if self.off_path > 0 || self.on_path == 0 {
            match byte {
                b'{' if self.on_path == 0 && self.off_path == 0 => {
                    self.on_path = 1;
                    self.member = Member::Name;
                }
                b'[' | b'{' => self.off_path += 1,
                b']' | b'}' => self.off_path = self.off_path.saturating_sub(1),
                _ => {}
            }
            return;
        }
        // Among the members of the innermost path object.
        match byte {
            b',' => self.member = Member::Name,
            b'[' | b'{' => {
                let matched = matches!(self.member, Member::Value { matched: true });
                self.member = Member::Value { matched: false };
                if matched && byte == b'[' && self.on_path == self.path.len() {
                    self.emptied = 1;
                } else if matched && byte == b'{' && self.on_path < self.path.len() {
                    self.on_path += 1;
                    self.member = Member::Name;
                } else {
                    self.off_path += 1;
                }
            }
            b']' | b'}' => {
                self.on_path -= 1;
                self.member = Member::Value { matched: false };
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const TURNS: &[&str] = &["result", "thread", "turns"];

    fn elide(text: &str, limit: usize) -> Option<String> {
        let mut elider = Elider::new(TURNS, limit);
        // Byte by byte and in one go must agree; the framer feeds whatever a read brought.
        for chunk in text.as_bytes().chunks(3) {
            elider.push(chunk);
        }
        elider.finish().map(|out| String::from_utf8(out).unwrap())
    }

    /// The value with `result.thread.turns` emptied when it is an array.
    fn emptied(mut value: Value) -> Value {
        if let Some(turns) = value
            .pointer_mut("/result/thread/turns")
            .filter(|turns| turns.is_array())
        {
            *turns = json!([]);
        }
        value
    }

    #[test]
    fn a_resume_answer_keeps_everything_but_its_turns() {
        let line = r#"{"id":"rethread-proxy:1","result":{"thread":{"id":"t","turns":[{"id":"a","items":[{"text":"]}\"["}]},{"id":"b"}],"name":null},"model":"m","cwd":"/w"}}"#;
        assert_eq!(
            elide(line, 1 << 20).unwrap(),
            r#"{"id":"rethread-proxy:1","result":{"thread":{"id":"t","turns":[],"name":null},"model":"m","cwd":"/w"}}"#
        );
    }

    #[test]
    fn only_the_path_is_emptied() {
        for line in [
            r#"{"turns":[1],"result":{"turns":[2],"thread":{"x":{"turns":[3]},"turns":4}}}"#,
            r#"{"result":{"thread":[{"turns":[1]}]}}"#,
            r#"{"result":{"thr\u0065ad":{"turns":[1]}}}"#,
            r#"[{"result":{"thread":{"turns":[1]}}}]"#,
            r#"{"result":{"threads":{"turns":[1]},"threa":{"turns":[2]}}}"#,
        ] {
            assert_eq!(elide(line, 1 << 20).as_deref(), Some(line));
        }
    }

    #[test]
    fn a_copy_past_the_limit_is_none() {
        let line = r#"{"result":{"thread":{"turns":[1,2,3]}},"x":"abcdef"}"#;
        let short = r#"{"result":{"thread":{"turns":[]}},"x":"abcdef"}"#;
        assert_eq!(elide(line, short.len()).as_deref(), Some(short));
        assert_eq!(elide(line, short.len() - 1), None);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let name = prop::sample::select(vec!["result", "thread", "turns", "id", "t\"x", "a\\"]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{}\"\\\\a-z, :]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec((name.clone(), inner), 0..5).prop_map(|members| {
                    Value::Object(
                        members
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    )
                }),
            ]
        })
    }

    proptest! {
        /// Any JSON text, compact or pretty: the copy reads as the value with its turns
        /// emptied, and nothing else of it changes.
        #[test]
        fn the_copy_is_the_value_with_its_turns_emptied(value in json_value(), pretty: bool) {
            let value = json!({"id": 1, "result": {"thread": value.clone(), "x": value}});
            let text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let copy = elide(&text, 1 << 20).unwrap();
            prop_assert_eq!(serde_json::from_str::<Value>(&copy).unwrap(), emptied(value));
        }

        /// Bytes that are not JSON never panic and never make a copy longer than the limit.
        #[test]
        fn any_bytes_are_safe(bytes in prop::collection::vec(any::<u8>(), 0..256), limit in 0usize..64) {
            let mut elider = Elider::new(TURNS, limit);
            elider.push(&bytes);
            if let Some(copy) = elider.finish() {
                prop_assert!(copy.len() <= limit);
            }
        }
    }
}
