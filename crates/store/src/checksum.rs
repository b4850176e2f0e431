//! Record checksums of the file backends: neither engine checks what a record holds when it
//! reads it, so a flipped byte in a key or a value would read back as another key or value.
//! Every SQLite row and redb value carries a CRC-32 of its fields, verified whenever it is read.

use crate::Result;
use crate::StoreError;

/// A CRC-32 over a record's fields, each with a type tag and (for bytes) its length, so that
/// moving bytes from one field to the next changes the sum. The first field is the table.
pub(crate) struct Checksum(crc32fast::Hasher);

impl Checksum {
    pub(crate) fn of(table: &str) -> Self {
        Checksum(crc32fast::Hasher::new()).text(table)
    }

    pub(crate) fn text(self, value: &str) -> Self {
        self.bytes(value.as_bytes())
    }

    /// Adds a field of bytes (summed like text).
    pub(crate) fn bytes(mut self, value: &[u8]) -> Self {
        self.0.update(&[1]);
        self.0.update(&(value.len() as u64).to_le_bytes());
        self.0.update(value);
        self
    }

    pub(crate) fn int(mut self, value: i64) -> Self {
        self.0.update(&[2]);
        self.0.update(&value.to_le_bytes());
        self
    }

    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn opt_text(self, value: Option<&str>) -> Self {
        match value {
            Some(v) => self.text(v),
            None => self.null(),
        }
    }

    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn opt_int(self, value: Option<i64>) -> Self {
        match value {
            Some(v) => self.int(v),
            None => self.null(),
        }
    }

    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    fn null(mut self) -> Self {
        self.0.update(&[0]);
        self
    }

    pub(crate) fn finish(self) -> i64 {
        i64::from(self.0.finalize())
    }
}

/// The checksum of the record that `thread_id` belongs to the session `session` (its id).
pub(crate) fn thread_checksum(thread_id: &str, session: &[u8]) -> i64 {
    Checksum::of("threads")
        .text(thread_id)
        .bytes(session)
        .finish()
}

impl crate::logic::FileKey<'_> {
    /// The checksum of chunk `seq` of this file holding `bytes`, as both file backends store it.
    pub(crate) fn chunk_checksum(&self, seq: i64, bytes: &[u8]) -> i64 {
        Checksum::of("mirror_chunks")
            .text(self.session_id)
            .text(self.thread_id)
            .text(self.path)
            .int(seq)
            .bytes(bytes)
            .finish()
    }
}

/// Fails with `Corrupt` unless `stored` is `computed`.
pub(crate) fn verify(
    label: &str,
    what: impl FnOnce() -> String,
    stored: i64,
    computed: i64,
) -> Result<()> {
    if stored == computed {
        return Ok(());
    }
    Err(StoreError::corrupt(
        label,
        format!(
            "{}: checksum mismatch (stored {stored:#x}, contents give {computed:#x}): \
             the record was changed outside rethread",
            what()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_delimited() {
        // Bytes moved between adjacent fields must change the sum.
        let a = Checksum::of("t").text("ab").text("c").finish();
        let b = Checksum::of("t").text("a").text("bc").finish();
        assert_ne!(a, b);
        let none = Checksum::of("t").opt_text(None).finish();
        let empty = Checksum::of("t").opt_text(Some("")).finish();
        assert_ne!(none, empty);
        assert_ne!(
            Checksum::of("t").opt_int(None).finish(),
            Checksum::of("t").opt_int(Some(0)).finish()
        );
    }
}
