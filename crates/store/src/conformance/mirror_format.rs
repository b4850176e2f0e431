//! The mirror's stored form: chunks are compressed (a share of the rollout's bytes), chunks a
//! rethread before compression stored raw are still read, appended to, exported and
//! verified, and a stored chunk that does not decode to its recorded bytes is `Corrupt`.
//!
//! These scenarios reach under the store's rules to the engine (as an older rethread wrote
//! it, or as damage leaves it), through [`BindingStore::engine`].

use serde_json::json;

use super::{th, turn, unique_id};
use crate::engine::{Answer, Request};
use crate::logic::{FileKey, WriteTxn};
use crate::{
    BindingStore, MirrorAppend, MirrorUpdate, MirroredFile, ProblemKind, Result, StoreError,
};

const ROLLOUT: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-f.jsonl";

/// Runs `op` in one write transaction of `store`'s engine, beside the store's rules.
async fn engine_write(
    store: &BindingStore,
    session: &str,
    mut op: impl FnMut(&mut dyn WriteTxn) -> Result<()> + Send + 'static,
) {
    let sessions = [session.to_string()];
    let request = Request::of("import_session", &sessions);
    store
        .engine()
        .write(
            request,
            Box::new(move |txn, _| op(txn).map(|()| Box::new(()) as Answer)),
        )
        .await
        .unwrap();
}

/// The chunks of `path` as the engine stores them.
pub(crate) async fn stored_chunks(
    store: &BindingStore,
    session: &str,
    thread: &str,
    path: &str,
) -> Vec<Vec<u8>> {
    let (s, t, p) = (session.to_string(), thread.to_string(), path.to_string());
    let answer = store
        .engine()
        .read(
            Request::new("export_session"),
            Box::new(move |txn| {
                let mut chunks = Vec::new();
                txn.load_chunks(FileKey::new(&s, &t, &p), 0..u64::MAX, &mut |_, bytes| {
                    chunks.push(bytes.to_vec());
                    Ok(())
                })?;
                Ok(Box::new(chunks) as Answer)
            }),
        )
        .await
        .unwrap();
    *answer.downcast().unwrap()
}

/// A session bound to `thread` with the mirrored file `path` held in `chunks` exactly as
/// given (`raw_lens`: the rollout bytes each stands for; `compressed_from` as the record
/// says), written through the engine as an older rethread or damage would leave it.
async fn with_stored_file(
    store: &BindingStore,
    session: &str,
    thread: &str,
    chunks: Vec<Vec<u8>>,
    raw: &[u8],
    raw_lens: Vec<u64>,
    compressed_from: Option<u64>,
) {
    store
        .commit_turn(turn(session, thread, vec![json!(1)]))
        .await
        .unwrap();
    let mut record = store.require_session(session).await.unwrap();
    record.mirror.files = vec![MirroredFile {
        thread_id: thread.to_string(),
        path: ROLLOUT.to_string(),
        len: raw.len() as u64,
        crc32: crc32fast::hash(raw),
        chunk_lens: raw_lens,
        compressed_from,
    }];
    let (s, t) = (session.to_string(), thread.to_string());
    engine_write(store, session, move |txn| {
        for (seq, chunk) in chunks.iter().enumerate() {
            txn.put_chunk(FileKey::new(&s, &t, ROLLOUT), seq as u64, chunk)?;
        }
        txn.put(&record)
    })
    .await;
}

/// A store written before compression holds raw chunks and records without
/// `compressed_from`: its files read back as they were (a raw chunk that starts with zstd's
/// magic number included: the record says what a chunk is, the bytes never do), verify,
/// export raw, and take appends, whose new chunks (and the newest merged with them) are
/// compressed while the older raw ones stay as they are.
pub async fn mirror_reads_raw_chunks_written_before_compression(store: &BindingStore) {
    let s = unique_id("mirror-raw");
    let t = th(&s, "t1");
    let mut a = vec![0x28, 0xb5, 0x2f, 0xfd];
    a.extend_from_slice(&b"{\"type\":\"session_meta\"}\n".repeat(12));
    let b = b"{\"type\":\"turn\",\"n\":1}\n".repeat(2);
    let raw = [a.clone(), b.clone()].concat();
    let lens = vec![a.len() as u64, b.len() as u64];
    with_stored_file(store, &s, &t, vec![a.clone(), b.clone()], &raw, lens, None).await;
    // Recorded as an older rethread recorded it: no `compressed_from` in the JSON.
    let record = store.require_session(&s).await.unwrap();
    let text = serde_json::to_string(&record.mirror).unwrap();
    assert!(!text.contains("compressed_from"), "{text}");

    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(raw.clone())
    );
    let export = store.export_session(&s).await.unwrap().unwrap();
    let exported: Vec<_> = export.mirror.iter().map(|c| c.bytes.clone()).collect();
    assert_eq!(exported, [a.clone(), b.clone()]);
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(report.is_ok(), "{report:?}");

    // An append: the new chunk is compressed and merged with the raw one before it (no
    // longer than it); the first raw chunk stays raw.
    let c = b"{\"type\":\"turn\",\"n\":2,\"text\":\"a longer line\"}\n".repeat(3);
    let append = MirrorAppend::extend(ROLLOUT, raw.len() as u64, crc32fast::hash(&raw), c.clone());
    store
        .commit_turn(turn(&s, &t, vec![json!(2)]).mirror(Some(MirrorUpdate::new(vec![append]))))
        .await
        .unwrap();
    let whole = [raw.clone(), c.clone()].concat();
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole.clone())
    );
    let record = store.require_session(&s).await.unwrap();
    let file = &record.mirror.files[0];
    assert_eq!(
        file.chunk_lens,
        [a.len() as u64, (b.len() + c.len()) as u64]
    );
    assert_eq!(file.compressed_from, Some(1));
    let chunks = stored_chunks(store, &s, &t, ROLLOUT).await;
    assert_eq!(chunks[0], a, "the raw chunk is left as it was");
    assert_ne!(chunks[1], [b.clone(), c.clone()].concat());
    assert_eq!(
        zstd::bulk::decompress(&chunks[1], 1 << 20).unwrap(),
        [b.clone(), c.clone()].concat()
    );

    // Exported raw, imported elsewhere in the same form, and back.
    let export = store.export_session(&s).await.unwrap().unwrap();
    let exported: Vec<_> = export.mirror.iter().map(|c| c.bytes.clone()).collect();
    assert_eq!(exported, [a.clone(), [b, c].concat()]);
    let elsewhere = BindingStore::memory();
    elsewhere.import_session(export.clone()).await.unwrap();
    assert_eq!(
        elsewhere.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole.clone())
    );
    assert_eq!(elsewhere.export_session(&s).await.unwrap().unwrap(), export);
    assert_eq!(stored_chunks(&elsewhere, &s, &t, ROLLOUT).await, chunks);
    assert_eq!(
        store.import_session(export).await.unwrap(),
        crate::ImportOutcome::AlreadyPresent
    );
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert!(store.delete_session(&s).await.unwrap());
}

/// A compressed chunk that does not decompress, decompresses past its recorded length (never
/// allocated: the bound is the record's), or to other bytes of the right length, is
/// `Corrupt` for its session wherever the file is read, and a `Mirror` problem to verify.
pub async fn mirror_chunk_that_does_not_decode_is_corrupt(store: &BindingStore) {
    let good = b"{\"type\":\"session_meta\"}\n".repeat(8);
    let tail = b"{\"type\":\"turn\"}\n".repeat(4);
    let raw = [good.clone(), tail.clone()].concat();
    let other = b"{\"type\":\"tUrn\"}\n".repeat(4);
    let mut cut = crate::logic::codec::encode(&tail).unwrap();
    cut.truncate(cut.len() - 3);
    let damages: [(&str, Vec<u8>); 4] = [
        ("garbage", b"not a zstd frame at all".to_vec()),
        ("cut", cut),
        (
            "longer",
            crate::logic::codec::encode(&vec![b'x'; 1 << 20]).unwrap(),
        ),
        ("other", crate::logic::codec::encode(&other).unwrap()),
    ];
    for (name, bad) in damages {
        let s = unique_id(&format!("mirror-undecodable-{name}"));
        let t = th(&s, "t1");
        let chunks = vec![crate::logic::codec::encode(&good).unwrap(), bad];
        let lens = vec![good.len() as u64, tail.len() as u64];
        with_stored_file(store, &s, &t, chunks, &raw, lens, Some(0)).await;
        let read = store.mirror_file(&s, &t, ROLLOUT).await;
        assert!(
            matches!(read, Err(StoreError::Corrupt { .. })),
            "{name}: {read:?}"
        );
        let export = store.export_session(&s).await;
        assert!(
            matches!(export, Err(StoreError::Corrupt { .. })),
            "{name}: {export:?}"
        );
        // An append would merge the damaged chunk: refused, never stored over.
        let append = MirrorAppend::extend(
            ROLLOUT,
            raw.len() as u64,
            crc32fast::hash(&raw),
            tail.clone(),
        );
        let commit = store
            .commit_turn(turn(&s, &t, vec![json!(2)]).mirror(Some(MirrorUpdate::new(vec![append]))))
            .await;
        // Other bytes of the right length merge as they are (only the file's CRC-32 shows
        // them), and the file still reads as damaged.
        match name {
            "other" => assert!(commit.is_ok(), "{commit:?}"),
            _ => assert!(
                matches!(commit, Err(StoreError::Corrupt { .. })),
                "{name}: {commit:?}"
            ),
        }
        let read = store.mirror_file(&s, &t, ROLLOUT).await;
        assert!(
            matches!(read, Err(StoreError::Corrupt { .. })),
            "{name}: {read:?}"
        );
        let report = store.verify(&mut |_| {}).await.unwrap();
        let ours: Vec<_> = report
            .problems
            .iter()
            .filter(|p| p.session_id.as_deref() == Some(s.as_str()))
            .map(|p| p.kind)
            .collect();
        // The file stores' own scan names the mirror; the others' check by export the session.
        assert!(
            matches!(ours[..], [ProblemKind::Mirror | ProblemKind::Session]),
            "{name}: {report:?}"
        );
        assert!(store.delete_session(&s).await.unwrap());
    }
}

/// Rollout bytes are stored compressed: a realistic codex rollout (`turns`, committed one
/// append per turn) costs at most 35% of its bytes in the store, and reads back whole.
pub async fn mirror_keeps_a_share_of_a_realistic_rollout(store: &BindingStore, turns: &[Vec<u8>]) {
    let s = unique_id("mirror-share");
    let t = th(&s, "t1");
    let mut whole: Vec<u8> = Vec::new();
    for (n, bytes) in turns.iter().enumerate() {
        let append = MirrorAppend::extend(
            ROLLOUT,
            whole.len() as u64,
            crc32fast::hash(&whole),
            bytes.clone(),
        );
        let commit = turn(&s, &t, vec![json!(n)]).mirror(Some(MirrorUpdate::new(vec![append])));
        store.commit_turn(commit).await.unwrap();
        whole.extend_from_slice(bytes);
    }
    let stored: usize = stored_chunks(store, &s, &t, ROLLOUT)
        .await
        .iter()
        .map(Vec::len)
        .sum();
    let share = stored as f64 / whole.len() as f64;
    assert!(
        share <= 0.35,
        "{stored} bytes stored for {} ({:.1}%)",
        whole.len(),
        share * 100.0
    );
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole)
    );
    assert!(store.delete_session(&s).await.unwrap());
}

/// The bytes the store keeps of the mirrored file `path` (its chunks as the engine stores
/// them, compressed or not): what a benchmark compares with the rollout's bytes.
pub async fn stored_mirror_bytes(
    store: &BindingStore,
    session: &str,
    thread: &str,
    path: &str,
) -> u64 {
    let chunks = stored_chunks(store, session, thread, path).await;
    chunks.iter().map(|c| c.len() as u64).sum()
}
