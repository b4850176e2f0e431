//! How a mirror chunk's rollout bytes are kept in the store: the one place every engine's
//! chunks pass through on their way in ([`encode`]) and out ([`Decoder`]), so engines store
//! opaque bytes and every backend keeps the same format. Today: zstd at [`LEVEL`]; a later
//! step (sealing) goes here too, after the compression.
//!
//! Which chunks are encoded is said by their file's record
//! ([`MirroredFile::compressed_from`](crate::MirroredFile::compressed_from)), never guessed
//! from the bytes: a raw chunk written before compression may start with anything, zstd's
//! magic number included.

use crate::mirror::MAX_CHUNK;

/// The zstd level of stored chunks. Measured on generated codex-shaped JSONL (`cargo xtask
/// bench mirror`, `docs/benchmarks.md`): level 3 keeps about a tenth fewer bytes than level 1
/// at a compression speed that still leaves a 5 KB turn's commit within a tenth of a
/// millisecond of its raw cost, and decompression speed does not depend on the level.
pub(crate) const LEVEL: i32 = 3;

/// The stored form of `raw` (a chunk of at most [`MAX_CHUNK`] bytes, or a sealed row's JSON):
/// one zstd frame, made with one compression context per thread, kept (making one costs more
/// than compressing a row).
pub(crate) fn encode(raw: &[u8]) -> Result<Vec<u8>, String> {
    thread_local! {
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let compressed = COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let compressor = match cell.as_mut() {
            Some(compressor) => compressor,
            None => cell.insert(zstd::bulk::Compressor::new(LEVEL)?),
        };
        compressor.compress(raw)
    });
    compressed.map_err(|e| format!("compressing failed: {e}"))
}

/// Decodes stored chunks back into their rollout bytes, reusing one buffer and one zstd
/// context for every chunk of a read: a restore holds one chunk at a time, never the file.
pub(crate) struct Decoder {
    context: Option<zstd::bulk::Decompressor<'static>>,
    buf: Vec<u8>,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Decoder {
            context: None,
            buf: Vec::new(),
        }
    }

    /// The rollout bytes of a stored chunk that should hold `raw_len` of them: `stored` itself
    /// when `compressed` is false, else its decompression, which is never let grow past
    /// `raw_len` (nor past [`MAX_CHUNK`], whatever the record says): a damaged or hostile chunk
    /// is an error, not gigabytes of memory. The caller checks the length of a raw chunk.
    pub(crate) fn decode<'a>(
        &'a mut self,
        compressed: bool,
        stored: &'a [u8],
        raw_len: u64,
    ) -> Result<&'a [u8], String> {
        if !compressed {
            return Ok(stored);
        }
        if raw_len > MAX_CHUNK as u64 {
            return Err(format!(
                "a compressed chunk recorded as {raw_len} bytes, past the largest chunk \
                 ({MAX_CHUNK})"
            ));
        }
        let context = match &mut self.context {
            Some(context) => context,
            None => self.context.insert(
                zstd::bulk::Decompressor::new()
                    .map_err(|e| format!("a zstd context could not be made: {e}"))?,
            ),
        };
        self.buf.clear();
        self.buf.reserve_exact(raw_len as usize);
        // Into the buffer's capacity only (at most a chunk): past it the decompression fails
        // rather than grows.
        let written = context
            .decompress_to_buffer(stored, &mut self.buf)
            .map_err(|e| format!("does not decompress ({e})"))?;
        if written as u64 != raw_len {
            return Err(format!(
                "decompresses to {written} bytes, {raw_len} recorded"
            ));
        }
        Ok(&self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_decodes_to_what_was_encoded() {
        let raw = b"{\"type\":\"response_item\"}\n".repeat(100);
        let stored = encode(&raw).unwrap();
        assert!(stored.len() < raw.len() / 10);
        let mut decoder = Decoder::new();
        assert_eq!(
            decoder.decode(true, &stored, raw.len() as u64).unwrap(),
            raw
        );
        // A raw chunk is handed back as stored, whatever its first bytes.
        assert_eq!(
            decoder.decode(false, &stored, raw.len() as u64).unwrap(),
            stored
        );
        assert_eq!(encode(b"").map(|s| s.is_empty()), Ok(false));
        assert_eq!(decoder.decode(true, &encode(b"").unwrap(), 0).unwrap(), b"");
    }

    /// A chunk that would decompress past its recorded length is refused without making the
    /// bytes: a hostile chunk of a few kilobytes that expands to a gigabyte costs nothing.
    #[test]
    fn decompression_is_bounded_by_the_recorded_length() {
        let raw = vec![b'x'; MAX_CHUNK];
        let stored = encode(&raw).unwrap();
        let mut decoder = Decoder::new();
        let short = decoder.decode(true, &stored, 1000).unwrap_err();
        assert!(short.contains("decompress"), "{short}");
        assert!(decoder.buf.capacity() < 4096, "{}", decoder.buf.capacity());
        let long = decoder
            .decode(true, &stored, MAX_CHUNK as u64 + 1)
            .unwrap_err();
        assert!(long.contains("past the largest chunk"), "{long}");
        // Shorter than recorded is damage too.
        let err = decoder
            .decode(true, &stored, MAX_CHUNK as u64 - 1)
            .unwrap_err();
        assert!(err.contains("decompress"), "{err}");
        // A frame whose header claims a gigabyte is refused on what was recorded.
        let mut bomb = zstd::bulk::Compressor::new(1).unwrap();
        bomb.include_contentsize(true).unwrap();
        let big = bomb.compress(&vec![0u8; 16 * MAX_CHUNK]).unwrap();
        let mut decoder = Decoder::new();
        assert!(decoder.decode(true, &big, 100).is_err());
        assert!(decoder.buf.capacity() < 4096, "{}", decoder.buf.capacity());
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let raw = b"{\"type\":\"event_msg\",\"payload\":{}}\n".repeat(50);
        let stored = encode(&raw).unwrap();
        let mut decoder = Decoder::new();
        for at in 0..stored.len() {
            let mut bad = stored.clone();
            bad[at] ^= 0x5a;
            // Either refused, or (a flipped bit zstd cannot see) other bytes whose length or
            // CRC-32 the caller checks.
            if let Ok(out) = decoder.decode(true, &bad, raw.len() as u64) {
                assert_eq!(out.len(), raw.len());
            }
        }
        for cut in 0..stored.len() {
            assert!(decoder
                .decode(true, &stored[..cut], raw.len() as u64)
                .is_err());
        }
        assert!(decoder.decode(true, b"not zstd", 8).is_err());
    }
}
