//! Lines a careless or hostile client may send, and what the fake does with them: what the
//! real codex does (its envelope is serde-derived structs, which refuse a duplicate field).

use rethread_fake_appserver::FakeAppServer;
use rethread_testkit::real::WirePeer;
use serde_json::json;

/// Issue 19, item 19: a request with two `id`s was answered (serde_json's `Value` keeps the
/// last one), so its answer could be taken for another request's. Codex refuses the line
/// ("duplicate field `id`") and answers nothing; so does the fake.
#[tokio::test]
async fn a_line_with_a_duplicate_envelope_member_is_ignored() {
    let (stream, handle) = FakeAppServer::builder().spawn_in_process().unwrap();
    let (read, write) = tokio::io::split(stream);
    let mut peer = WirePeer::new(read, write);
    peer.initialize(false).await.unwrap();
    for line in [
        r#"{"id":1,"id":"rethread-proxy:1","method":"thread/list","params":{}}"#,
        r#"{"id":"dup-method","method":"thread/list","method":"thread/read","params":{}}"#,
        r#"{"id":"dup-params","method":"thread/list","params":{},"params":{}}"#,
    ] {
        peer.send_raw(format!("{line}\n").as_bytes()).await.unwrap();
    }
    let after = peer.request("thread/list", Some(json!({}))).await.unwrap();
    assert!(after.get("result").is_some(), "{after}");
    assert_eq!(
        peer.log.len(),
        2,
        "only the initialize and the last thread/list are answered: {:#?}",
        peer.log
    );
    let methods = handle.methods();
    assert_eq!(
        methods.iter().filter(|m| *m == "thread/list").count(),
        1,
        "{methods:?}"
    );
}
