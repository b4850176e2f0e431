//! Sealed stores (`docs/design.md`, "Sealed stores"): with a [`StoreKey`], every transcript
//! row and every mirror chunk is compressed, then encrypted and authenticated
//! (XChaCha20-Poly1305, a fresh random 24-byte nonce per write) with the record's identity as
//! associated data, so a sealed value moved to another session, row, file or chunk fails its
//! check. Session ids, thread ids, statuses, sizes and times stay readable.
//!
//! The one place this happens is [`Sealed`], a view over an engine's transaction that seals on
//! the way in and opens on the way out: the store's rules and the engines never see the other
//! form, and a mirror chunk is sealed after the codec (`logic::codec`) compressed it.

use std::ops::Range;

use base64::engine::general_purpose::STANDARD_NO_PAD as BASE64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::logic::{ChunkSink, FileKey, LeaseTxn, ReadTxn, WriteTxn};
use crate::{Result, SessionRecord, StoreError, StoreKey, TranscriptRow};

/// The format of a sealed value: its first byte.
const VERSION: u8 = 1;
const NONCE_LEN: usize = 24;

/// Seals and opens a store's values with one key.
pub(crate) struct Sealer {
    cipher: XChaCha20Poly1305,
    check: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(redacted)")
    }
}

impl Sealer {
    pub(crate) fn new(key: &StoreKey) -> Self {
        Sealer {
            cipher: XChaCha20Poly1305::new(key.as_bytes().into()),
            check: key_check(key),
        }
    }

    /// What the store keeps to tell this key from another: 63 bits of a hash of the key
    /// under a label of its own (nothing an attacker can turn back into the key).
    pub(crate) fn check(&self) -> u64 {
        self.check
    }

    /// `plain` sealed under `aad`: version, nonce, ciphertext and tag.
    fn seal(&self, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|e| StoreError::Internal(format!("no random nonce: {e}")))?;
        let sealed = self
            .cipher
            .encrypt(&nonce.into(), Payload { msg: plain, aad })
            .map_err(|_| StoreError::Internal("sealing failed".to_string()))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// What `sealed` holds, if it was sealed with this key under `aad`.
    fn open(&self, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let (&version, rest) = sealed.split_first()?;
        if version != VERSION || rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().ok()?;
        let payload = Payload { msg: body, aad };
        self.cipher.decrypt(&nonce.into(), payload).ok()
    }
}

/// The check value a store sealed with `key` records ([`Sealer::check`]).
pub(crate) fn key_check(key: &StoreKey) -> u64 {
    let digest = Sha256::new()
        .chain_update(b"rethread/key-check/v1\0")
        .chain_update(key.as_bytes())
        .finalize();
    let bytes: [u8; 8] = digest[..8].try_into().expect("8 of 32 bytes");
    u64::from_be_bytes(bytes) & i64::MAX as u64
}

/// The associated data of row `seq` of `session_id`.
fn row_aad(session_id: &str, seq: u64) -> Vec<u8> {
    let mut aad = b"rethread/row/v1\0".to_vec();
    aad.extend_from_slice(session_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(&seq.to_be_bytes());
    aad
}

/// The associated data of chunk `seq` of `file`.
fn chunk_aad(file: FileKey<'_>, seq: u64) -> Vec<u8> {
    let mut aad = b"rethread/chunk/v1\0".to_vec();
    for part in [file.session_id, file.thread_id, file.path] {
        aad.extend_from_slice(part.as_bytes());
        aad.push(0);
    }
    aad.extend_from_slice(&seq.to_be_bytes());
    aad
}

/// A row body as a sealed store keeps it: a JSON string of the sealed, compressed JSON text.
fn seal_row(sealer: &Sealer, session_id: &str, seq: u64, body: &Value) -> Result<Value> {
    let text = serde_json::to_vec(body).map_err(|e| StoreError::Internal(e.to_string()))?;
    let packed = crate::logic::codec::encode(&text).map_err(StoreError::Internal)?;
    let sealed = sealer.seal(&row_aad(session_id, seq), &packed)?;
    Ok(Value::String(BASE64.encode(sealed)))
}

fn open_row(sealer: &Sealer, label: &str, session_id: &str, row: TranscriptRow) -> Result<Value> {
    let damaged = || {
        StoreError::corrupt(
            label,
            format!(
                "row {} of session {session_id} does not open with this key \
                 (damaged, or not this record's)",
                row.seq
            ),
        )
    };
    let sealed = row.body.as_str().and_then(|text| BASE64.decode(text).ok());
    let packed = sealed
        .and_then(|sealed| sealer.open(&row_aad(session_id, row.seq), &sealed))
        .ok_or_else(damaged)?;
    let text = zstd::stream::decode_all(packed.as_slice()).map_err(|_| damaged())?;
    serde_json::from_slice(&text).map_err(|_| damaged())
}

/// An engine's transaction seen through a [`Sealer`]: rows and chunks sealed as they are
/// written and opened as they are read; everything else passes through.
pub(crate) struct Sealed<'t, T: ?Sized> {
    pub(crate) txn: &'t mut T,
    pub(crate) sealer: &'t Sealer,
}

impl<T: ReadTxn + ?Sized> ReadTxn for Sealed<'_, T> {
    fn label(&self) -> &str {
        self.txn.label()
    }
    fn load(&mut self, session_id: &str) -> Result<Option<SessionRecord>> {
        self.txn.load(session_id)
    }
    fn load_rows(&mut self, session_id: &str, range: Range<u64>) -> Result<Vec<TranscriptRow>> {
        let rows = self.txn.load_rows(session_id, range)?;
        let label = self.txn.label().to_string();
        rows.into_iter()
            .map(|row| {
                let seq = row.seq;
                let body = open_row(self.sealer, &label, session_id, row)?;
                Ok(TranscriptRow { seq, body })
            })
            .collect()
    }
    fn list(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<SessionRecord>> {
        self.txn.list(after, limit)
    }
    fn has_rows(&mut self, session_id: &str) -> Result<bool> {
        self.txn.has_rows(session_id)
    }
    fn row_bytes(&mut self, session_id: &str) -> Result<u64> {
        self.txn.row_bytes(session_id)
    }
    fn thread_owner(&mut self, thread_id: &str) -> Result<Option<String>> {
        self.txn.thread_owner(thread_id)
    }
    fn session_threads(&mut self, session_id: &str) -> Result<Vec<String>> {
        self.txn.session_threads(session_id)
    }
    fn row_ends(&mut self) -> Result<Vec<(String, bool)>> {
        self.txn.row_ends()
    }
    fn stale_leases(&mut self, after: &str, cutoff: i64, limit: usize) -> Result<Vec<String>> {
        self.txn.stale_leases(after, cutoff, limit)
    }
    fn seal_check(&mut self) -> Result<Option<u64>> {
        self.txn.seal_check()
    }
    fn load_chunks(&mut self, file: FileKey<'_>, range: Range<u64>, each: ChunkSink) -> Result<()> {
        let label = self.txn.label().to_string();
        let sealer = self.sealer;
        self.txn.load_chunks(file, range, &mut |seq, sealed| {
            let plain = sealer.open(&chunk_aad(file, seq), sealed).ok_or_else(|| {
                StoreError::corrupt(
                    &label,
                    format!(
                        "chunk {seq} of the mirror of {file} does not open with this key \
                         (damaged, or not this file's)"
                    ),
                )
            })?;
            each(seq, &plain)
        })
    }
}

impl<T: WriteTxn + ?Sized> WriteTxn for Sealed<'_, T> {
    fn put(&mut self, record: &SessionRecord) -> Result<()> {
        self.txn.put(record)
    }
    fn put_rows(&mut self, session_id: &str, first_seq: u64, bodies: &[Value]) -> Result<()> {
        let sealed = (first_seq..)
            .zip(bodies)
            .map(|(seq, body)| seal_row(self.sealer, session_id, seq, body))
            .collect::<Result<Vec<_>>>()?;
        self.txn.put_rows(session_id, first_seq, &sealed)
    }
    fn put_thread_owner(&mut self, thread_id: &str, session_id: &str) -> Result<()> {
        self.txn.put_thread_owner(thread_id, session_id)
    }
    fn put_chunk(&mut self, file: FileKey<'_>, seq: u64, bytes: &[u8]) -> Result<()> {
        let sealed = self.sealer.seal(&chunk_aad(file, seq), bytes)?;
        self.txn.put_chunk(file, seq, &sealed)
    }
    fn remove_chunks(&mut self, file: FileKey<'_>, from: u64) -> Result<()> {
        self.txn.remove_chunks(file, from)
    }
    fn remove(&mut self, session_id: &str) -> Result<bool> {
        self.txn.remove(session_id)
    }
    fn reclaim(&mut self) -> Result<u64> {
        self.txn.reclaim()
    }
    fn put_seal_check(&mut self, check: u64) -> Result<()> {
        self.txn.put_seal_check(check)
    }
    fn leases(&mut self) -> &mut dyn LeaseTxn {
        self.txn.leases()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sealer() -> Sealer {
        Sealer::new(&StoreKey::generate().unwrap())
    }

    #[test]
    fn a_row_opens_only_with_its_key_in_its_place() {
        let sealer = sealer();
        let body = json!({"role": "user", "text": "the marker zebra-42"});
        let sealed = seal_row(&sealer, "s", 3, &body).unwrap();
        assert!(!sealed.to_string().contains("zebra"));
        let row = |seq| TranscriptRow {
            seq,
            body: sealed.clone(),
        };
        assert_eq!(open_row(&sealer, "l", "s", row(3)).unwrap(), body);
        // Another position, another session, another key: each fails its check.
        assert!(open_row(&sealer, "l", "s", row(4)).is_err());
        assert!(open_row(&sealer, "l", "t", row(3)).is_err());
        assert!(open_row(&self::sealer(), "l", "s", row(3)).is_err());
        // Two seals of one value differ (a fresh nonce each).
        assert_ne!(seal_row(&sealer, "s", 3, &body).unwrap(), sealed);
    }

    #[test]
    fn a_flipped_or_cut_seal_never_opens_and_never_panics() {
        let sealer = sealer();
        let aad = b"aad";
        let sealed = sealer.seal(aad, b"chunk bytes").unwrap();
        for at in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert!(sealer.open(aad, &bad).is_none(), "{at}");
            assert!(sealer.open(aad, &sealed[..at]).is_none(), "{at}");
        }
        assert_eq!(sealer.open(aad, &sealed).unwrap(), b"chunk bytes");
    }

    /// Two sealed rows swapped below the store (where a stolen-and-edited file would put
    /// them): each fails its check, reads are `Corrupt`, and `verify` names the session.
    #[tokio::test]
    async fn rows_swapped_below_the_seal_are_corrupt_and_verify_names_their_session() {
        use crate::engine::{Answer, Request};
        use crate::{BindingStore, TurnCommit};
        let key = StoreKey::generate().unwrap();
        let store = BindingStore::memory().sealed(&key, false).await.unwrap();
        let rows = vec![json!({"text": "first"}), json!({"text": "second"})];
        store
            .commit_turn(TurnCommit::new("s", "t", rows))
            .await
            .unwrap();
        store
            .commit_turn(TurnCommit::new("other", "t2", vec![json!(1)]))
            .await
            .unwrap();
        let swap = Box::new(|txn: &mut dyn WriteTxn, _| {
            let record = txn.load("s")?.unwrap();
            let mut bodies: Vec<Value> = txn
                .load_rows("s", 0..2)?
                .into_iter()
                .map(|r| r.body)
                .collect();
            bodies.swap(0, 1);
            txn.remove("s")?;
            txn.put(&record)?;
            txn.put_thread_owner("t", "s")?;
            txn.put_rows("s", 0, &bodies)?;
            Ok(Box::new(()) as Answer)
        });
        store
            .engine()
            .write(Request::new("test"), swap)
            .await
            .unwrap();
        let read = store.rows("s", 0..2).await;
        assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
        let report = store.verify(&mut |_| {}).await.unwrap();
        let named: Vec<_> = report
            .problems
            .iter()
            .filter_map(|p| p.session_id.as_deref())
            .collect();
        assert_eq!(named, ["s"], "{report:?}");
    }

    #[test]
    fn the_key_check_tells_keys_apart_and_fits_a_signed_column() {
        let (a, b) = (StoreKey::generate().unwrap(), StoreKey::generate().unwrap());
        assert_eq!(key_check(&a), key_check(&a.clone()));
        assert_ne!(key_check(&a), key_check(&b));
        assert!(key_check(&a) <= i64::MAX as u64);
    }
}
