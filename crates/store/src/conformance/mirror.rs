//! The rollout mirror: appended with the turn in one transaction, refused unless it extends,
//! replaced whole from base 0, stopped past the cap, dropped when stale or retired, and
//! carried by delete, export, import, copy and verify.

use serde_json::json;

use super::{lost, th, turn, unique_id};
use crate::{
    crc32_extend, BindingStore, Lease, MirrorAppend, MirrorOutcome, MirrorUpdate, StoreError,
    TurnCommit,
};

const ROLLOUT: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-t.jsonl";
const HEAD: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-t_h.jsonl";

fn mirrored(commit: TurnCommit, appends: Vec<MirrorAppend>) -> TurnCommit {
    commit.mirror(Some(MirrorUpdate::new(appends)))
}

/// The stored length and CRC-32 of `path` in `session` for `thread`.
async fn state(store: &BindingStore, s: &str, thread: &str, path: &str) -> Option<(u64, u32)> {
    let record = store.session(s).await.unwrap()?;
    let file = record.mirror.files_of(thread).find(|f| f.path == path)?;
    Some((file.len, file.crc32))
}

/// What [`BindingStore::write_mirror_file`] writes of `path`, with the length and CRC-32 it
/// says it wrote; `None` when it writes nothing.
async fn written(
    store: &BindingStore,
    s: &str,
    thread: &str,
    path: &str,
) -> Option<(Vec<u8>, u64, u32)> {
    let out = crate::store::MemoryFile::default();
    let stored = store
        .write_mirror_file(s, thread, path, Box::new(out.clone()))
        .await
        .unwrap();
    let bytes = out.lock().clone();
    match stored {
        Some(file) => Some((bytes, file.len, file.crc32)),
        None => {
            assert!(bytes.is_empty(), "written without a file: {bytes:?}");
            None
        }
    }
}

/// A turn's appends are stored with it: the record says the file's length and CRC-32 (the
/// CRC of the whole file, combined per append), and the file reads back whole.
pub async fn mirror_appends_with_the_turn(store: &BindingStore) {
    let s = unique_id("mirror-append");
    let t = th(&s, "t1");
    let first = b"{\"type\":\"session_meta\"}\n".to_vec();
    let out = store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(1)]),
            vec![MirrorAppend::whole(ROLLOUT, first.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(out.mirror(), MirrorOutcome::Mirrored);
    let crc = crc32fast::hash(&first);
    assert_eq!(
        state(store, &s, &t, ROLLOUT).await,
        Some((first.len() as u64, crc))
    );
    let second = b"{\"type\":\"turn\"}\n".to_vec();
    let out = store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(2)]),
            vec![MirrorAppend::extend(
                ROLLOUT,
                first.len() as u64,
                crc,
                second.clone(),
            )],
        ))
        .await
        .unwrap();
    assert_eq!(out.mirror(), MirrorOutcome::Mirrored);
    let whole = [first.clone(), second.clone()].concat();
    assert_eq!(
        state(store, &s, &t, ROLLOUT).await,
        Some((whole.len() as u64, crc32fast::hash(&whole)))
    );
    assert_eq!(
        crc32_extend(crc, first.len() as u64, &second),
        crc32fast::hash(&whole)
    );
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole.clone())
    );
    // A second file of the thread (a paginated revert's head file) sits beside the first;
    // growing one leaves the other as it is.
    let head = b"{\"type\":\"session_meta\",\"history_base\":1}\n".to_vec();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(3)]),
            vec![MirrorAppend::whole(HEAD, head.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole.clone())
    );
    assert_eq!(
        store.mirror_file(&s, &t, HEAD).await.unwrap(),
        Some(head.clone())
    );
    // Streamed into a writer, each file is the same bytes, with their length and CRC-32.
    for bytes in [&whole, &head] {
        let path = if bytes == &head { HEAD } else { ROLLOUT };
        assert_eq!(
            written(store, &s, &t, path).await,
            Some((bytes.clone(), bytes.len() as u64, crc32fast::hash(bytes)))
        );
    }
    assert_eq!(written(store, &s, &th(&s, "other"), ROLLOUT).await, None);
    assert_eq!(written(store, &unique_id("none"), &t, HEAD).await, None);
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.row_count, 3);
    assert_eq!(record.mirror.files_of(&t).count(), 2);
    assert_eq!(record.mirror.bytes(), (whole.len() + head.len()) as u64);
    assert_eq!(
        store
            .mirror_file(&s, &th(&s, "other"), ROLLOUT)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .mirror_file(&unique_id("none"), &t, ROLLOUT)
            .await
            .unwrap(),
        None
    );
}

/// An append whose base is not the stored file (another length, another CRC-32, or no file)
/// is refused and nothing of the commit is written, rows and binding included; base 0
/// replaces the file whole.
pub async fn mirror_refuses_an_append_that_does_not_extend(store: &BindingStore) {
    let s = unique_id("mirror-refuse");
    let t = th(&s, "t1");
    let first = b"line one\n".to_vec();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(1)]),
            vec![MirrorAppend::whole(ROLLOUT, first.clone())],
        ))
        .await
        .unwrap();
    let before = store.export_session(&s).await.unwrap().unwrap();
    let crc = crc32fast::hash(&first);
    let len = first.len() as u64;
    for (label, append) in [
        (
            "length",
            MirrorAppend::extend(ROLLOUT, len - 1, crc, b"x\n".to_vec()),
        ),
        (
            "crc",
            MirrorAppend::extend(ROLLOUT, len, crc ^ 1, b"x\n".to_vec()),
        ),
        ("no file", MirrorAppend::extend(HEAD, 5, 0, b"x\n".to_vec())),
    ] {
        let refused = store
            .commit_turn(mirrored(
                turn(&s, &th(&s, "t2"), vec![json!(2)]),
                vec![append],
            ))
            .await;
        assert!(
            matches!(&refused, Err(StoreError::MirrorMismatch { path, .. }) if !path.is_empty()),
            "{label}: {refused:?}"
        );
        assert!(refused.unwrap_err().is_logical());
        assert_eq!(
            store.export_session(&s).await.unwrap().unwrap(),
            before,
            "{label}: nothing written"
        );
    }
    let replacement = b"another history\n".to_vec();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(2)]),
            vec![MirrorAppend::whole(ROLLOUT, replacement.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(replacement.clone())
    );
    assert_eq!(
        state(store, &s, &t, ROLLOUT).await,
        Some((replacement.len() as u64, crc32fast::hash(&replacement)))
    );
    // Refused input: a path that leaves the home or is not a rollout (a restore would write
    // it into a home), a file named twice.
    for appends in [
        vec![MirrorAppend::whole("../escape.jsonl", b"x\n".to_vec())],
        vec![MirrorAppend::whole("/abs.jsonl", b"x\n".to_vec())],
        vec![MirrorAppend::whole("state_5.sqlite", b"x\n".to_vec())],
        vec![MirrorAppend::whole("config.toml", b"x\n".to_vec())],
        vec![
            MirrorAppend::whole(ROLLOUT, b"x\n".to_vec()),
            MirrorAppend::whole(ROLLOUT, b"y\n".to_vec()),
        ],
    ] {
        let refused = store
            .commit_turn(mirrored(turn(&s, &t, vec![json!(3)]), appends))
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{refused:?}"
        );
    }
    assert_eq!(store.require_session(&s).await.unwrap().row_count, 2);
}

/// Past the cap mirroring stops for the session: that commit drops the session's mirror and
/// says so once ([`MirrorOutcome::StoppedNow`]), the turn still commits, and later commits
/// write no mirror ([`MirrorOutcome::Stopped`]).
pub async fn mirror_stops_past_the_cap(store: &BindingStore) {
    let s = unique_id("mirror-cap");
    let t = th(&s, "t1");
    let capped =
        |commit: TurnCommit, appends| commit.mirror(Some(MirrorUpdate::new(appends).cap(20)));
    let first = b"0123456789\n".to_vec();
    let out = store
        .commit_turn(capped(
            turn(&s, &t, vec![json!(1)]),
            vec![MirrorAppend::whole(ROLLOUT, first.clone())],
        ))
        .await
        .unwrap();
    assert_eq!(out.mirror(), MirrorOutcome::Mirrored);
    let out = store
        .commit_turn(capped(
            turn(&s, &t, vec![json!(2)]),
            vec![MirrorAppend::extend(
                ROLLOUT,
                11,
                crc32fast::hash(&first),
                b"0123456789\n".to_vec(),
            )],
        ))
        .await
        .unwrap();
    assert_eq!(
        out.mirror(),
        MirrorOutcome::StoppedNow { bytes: 22, cap: 20 }
    );
    assert!(out.is_published());
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.row_count, 2);
    assert!(record.mirror.stopped);
    assert!(record.mirror.files.is_empty());
    assert_eq!(store.mirror_file(&s, &t, ROLLOUT).await.unwrap(), None);
    let out = store
        .commit_turn(capped(
            turn(&s, &t, vec![json!(3)]),
            vec![MirrorAppend::whole(ROLLOUT, b"x\n".to_vec())],
        ))
        .await
        .unwrap();
    assert_eq!(out.mirror(), MirrorOutcome::Stopped);
    let record = store.require_session(&s).await.unwrap();
    assert_eq!(record.row_count, 3);
    assert!(record.mirror.files.is_empty());
}

/// The cap stops mirroring for the thread that passed it: once that thread is given up (or
/// ended) or another thread replaces it, the new thread is mirrored again.
pub async fn mirror_starts_again_for_the_thread_replacing_a_capped_one(store: &BindingStore) {
    let capped = |commit: TurnCommit, bytes: &[u8]| {
        let append = MirrorAppend::whole(ROLLOUT, bytes.to_vec());
        commit.mirror(Some(MirrorUpdate::new(vec![append]).cap(20)))
    };
    let big = b"0123456789012345678901234\n";
    for replaced_by in ["give-up", "commit"] {
        let s = unique_id("mirror-cap-again");
        let (t1, t2) = (th(&s, "t1"), th(&s, "t2"));
        let out = store
            .commit_turn(capped(turn(&s, &t1, vec![json!(1)]), big))
            .await;
        assert!(matches!(
            out.unwrap().mirror(),
            MirrorOutcome::StoppedNow { .. }
        ));
        let out = store
            .commit_turn(capped(turn(&s, &t1, vec![json!(2)]), b"x\n"))
            .await;
        assert_eq!(
            out.unwrap().mirror(),
            MirrorOutcome::Stopped,
            "still t1's cap"
        );
        if replaced_by == "give-up" {
            store
                .retire_thread(&s, &t1, lost("gone", "x"), None)
                .await
                .unwrap();
            assert!(!store.require_session(&s).await.unwrap().mirror.stopped);
        }
        let out = store
            .commit_turn(capped(turn(&s, &t2, vec![json!(3)]), b"x\n"))
            .await;
        assert_eq!(
            out.unwrap().mirror(),
            MirrorOutcome::Mirrored,
            "{replaced_by}"
        );
        assert_eq!(
            store
                .mirror_file(&s, &t2, ROLLOUT)
                .await
                .unwrap()
                .as_deref(),
            Some(b"x\n".as_slice())
        );
        assert!(!store.require_session(&s).await.unwrap().mirror.stopped);
    }
}

/// A commit without a mirror drops the thread's (it no longer holds the last committed
/// turn); retiring a thread drops its mirror, and a retired thread's commit mirrors nothing.
pub async fn mirror_is_dropped_when_stale_or_retired(store: &BindingStore) {
    let s = unique_id("mirror-drop");
    let t = th(&s, "t1");
    let line = b"line\n".to_vec();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(1)]),
            vec![MirrorAppend::whole(ROLLOUT, line.clone())],
        ))
        .await
        .unwrap();
    let out = store
        .commit_turn(turn(&s, &t, vec![json!(2)]))
        .await
        .unwrap();
    assert_eq!(out.mirror(), MirrorOutcome::None);
    assert_eq!(store.mirror_file(&s, &t, ROLLOUT).await.unwrap(), None);
    assert!(store
        .require_session(&s)
        .await
        .unwrap()
        .mirror
        .files
        .is_empty());

    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(3)]),
            vec![MirrorAppend::whole(ROLLOUT, line.clone())],
        ))
        .await
        .unwrap();
    store
        .retire_thread(&s, &t, lost("gone", "no rollout"), None)
        .await
        .unwrap();
    assert_eq!(store.mirror_file(&s, &t, ROLLOUT).await.unwrap(), None);
    let out = store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(4)]),
            vec![MirrorAppend::whole(ROLLOUT, line)],
        ))
        .await
        .unwrap();
    assert!(!out.is_published());
    assert_eq!(out.mirror(), MirrorOutcome::None);
    assert!(store
        .require_session(&s)
        .await
        .unwrap()
        .mirror
        .files
        .is_empty());
}

/// A fenced commit refused for a lost lease writes no mirror either.
pub async fn mirror_of_a_refused_commit_is_not_written(store: &BindingStore) {
    let s = unique_id("mirror-fence");
    let t = th(&s, "t1");
    let owner = super::leases::owner("mirror-fence");
    let first: Lease = store
        .acquire_lease(&s, &owner, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let second = store
        .acquire_lease(&s, &owner, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let refused = store
        .commit_turn(
            mirrored(
                turn(&s, &t, vec![json!(1)]),
                vec![MirrorAppend::whole(ROLLOUT, b"x\n".to_vec())],
            )
            .fence(Some(first.fence())),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert_eq!(store.mirror_file(&s, &t, ROLLOUT).await.unwrap(), None);
    store.release_lease(&second).await.unwrap();
}

/// The mirror goes with the session: `delete_session` removes it, an export carries its
/// chunks (checked against the record), an import writes them, `copy_sessions` copies them
/// and `verify` reads them.
pub async fn mirror_travels_with_the_session(store: &BindingStore) {
    let s = unique_id("mirror-travel");
    let t = th(&s, "t1");
    // The first append is the longer: two chunks (the newest are merged only while the one
    // before is no longer than the last).
    let (a, b) = (b"the first line\n".to_vec(), b"second\n".to_vec());
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(1)]),
            vec![MirrorAppend::whole(ROLLOUT, a.clone())],
        ))
        .await
        .unwrap();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!(2)]),
            vec![MirrorAppend::extend(
                ROLLOUT,
                a.len() as u64,
                crc32fast::hash(&a),
                b.clone(),
            )],
        ))
        .await
        .unwrap();
    let export = store.export_session(&s).await.unwrap().unwrap();
    assert_eq!(export.mirror.len(), 2, "a chunk per append, none merged");
    assert_eq!(
        export
            .mirror
            .iter()
            .map(|c| c.bytes.clone())
            .collect::<Vec<_>>(),
        [a.clone(), b.clone()]
    );
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert!(report.mirror_files >= 1, "{report:?}");

    // Copied out and back.
    let elsewhere = crate::BindingStore::memory();
    let copied = crate::copy_sessions(store, &elsewhere, &mut |_| {})
        .await
        .unwrap();
    assert!(copied.mirror_bytes_copied >= (a.len() + b.len()) as u64);
    assert_eq!(
        elsewhere.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some([a.clone(), b.clone()].concat())
    );
    assert!(store.delete_session(&s).await.unwrap());
    assert_eq!(store.mirror_file(&s, &t, ROLLOUT).await.unwrap(), None);
    // A new session under the id starts without a mirror.
    store
        .commit_turn(turn(&s, &th(&s, "t2"), vec![json!(1)]))
        .await
        .unwrap();
    assert!(store.require_session(&s).await.unwrap().mirror.is_empty());
    assert!(store.delete_session(&s).await.unwrap());
    let back = elsewhere.export_session(&s).await.unwrap().unwrap();
    assert_eq!(
        store.import_session(back.clone()).await.unwrap(),
        crate::ImportOutcome::Imported
    );
    assert_eq!(store.export_session(&s).await.unwrap().unwrap(), export);
    assert_eq!(
        store.import_session(back.clone()).await.unwrap(),
        crate::ImportOutcome::AlreadyPresent
    );
    // An export whose chunks are not what its record says is refused.
    let mut missing = back.clone();
    missing.record.session_id = unique_id("mirror-bad");
    missing.mirror.pop();
    let refused = store.import_session(missing.clone()).await;
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    let mut changed = back;
    changed.record.session_id = missing.record.session_id.clone();
    changed.mirror[1].bytes[0] ^= 1;
    let refused = store.import_session(changed).await;
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(
        store.session(&missing.record.session_id).await.unwrap(),
        None
    );
}

/// The newest chunks are merged while the one before the last is no longer than the last, up
/// to 1 MiB a chunk: many small appends stay a few chunks (a restore reads few rows), a big
/// file is split, and the bytes are the file's either way.
pub async fn mirror_merges_its_newest_chunks(store: &BindingStore) {
    let s = unique_id("mirror-merge");
    let t = th(&s, "t1");
    let line = [b'x'; 99]
        .iter()
        .copied()
        .chain([b'\n'])
        .collect::<Vec<u8>>();
    let mut whole: Vec<u8> = Vec::new();
    for n in 0..10u64 {
        let append = MirrorAppend::extend(
            ROLLOUT,
            whole.len() as u64,
            crc32fast::hash(&whole),
            line.clone(),
        );
        let append = if n == 0 {
            MirrorAppend::whole(ROLLOUT, line.clone())
        } else {
            append
        };
        store
            .commit_turn(mirrored(turn(&s, &t, vec![json!(n)]), vec![append]))
            .await
            .unwrap();
        whole.extend_from_slice(&line);
    }
    let record = store.require_session(&s).await.unwrap();
    let file = record.mirror.files_of(&t).next().unwrap();
    // Ten appends of 100 bytes: 8 + 2, as a binary counter.
    assert_eq!(file.chunk_lens, [800, 200]);
    assert_eq!(
        store.mirror_file(&s, &t, ROLLOUT).await.unwrap(),
        Some(whole.clone())
    );

    // A file past 1 MiB is split, and halves of a chunk merge up to it, not past it.
    let big = vec![b'y'; 2 * 1024 * 1024 + 512 * 1024 - 1]
        .into_iter()
        .chain([b'\n'])
        .collect::<Vec<u8>>();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!("big")]),
            vec![MirrorAppend::whole(HEAD, big.clone())],
        ))
        .await
        .unwrap();
    let half = vec![b'z'; 512 * 1024 - 1]
        .into_iter()
        .chain([b'\n'])
        .collect::<Vec<u8>>();
    store
        .commit_turn(mirrored(
            turn(&s, &t, vec![json!("half")]),
            vec![MirrorAppend::extend(
                HEAD,
                big.len() as u64,
                crc32fast::hash(&big),
                half.clone(),
            )],
        ))
        .await
        .unwrap();
    let record = store.require_session(&s).await.unwrap();
    let head = record.mirror.files_of(&t).find(|f| f.path == HEAD).unwrap();
    let mib = 1024 * 1024;
    assert_eq!(head.chunk_lens, [mib, mib, mib]);
    assert_eq!(
        store.mirror_file(&s, &t, HEAD).await.unwrap(),
        Some([big, half].concat())
    );
    let export = store.export_session(&s).await.unwrap().unwrap();
    assert_eq!(export.mirror.len(), 5);
}
