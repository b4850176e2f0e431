//! One test per resource bound of the client and the agent (issue 7): a server that floods or
//! stalls cannot make the host's memory grow without limit or hang it. The bounds already
//! covered in `client.rs` (a stalled request, a line past the limit, garbage lines, pending
//! requests, a slow consumer) are not repeated here.

mod support;

use std::time::Duration;

use rethread_runtime::{
    AppServerClient, BinderOptions, ClientError, ClientOptions, RuntimeError, SessionBinder,
    StatusKind, StatusRail,
};
use rethread_store::BindingStore;
use serde_json::{json, Value};
use support::{connect_over, Peer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Generous bound for "it did not hang" (every timeout below is far shorter).
const HANG: Duration = Duration::from_secs(20);

fn read_params(id: &str) -> Value {
    json!({"threadId": id, "includeTurns": false})
}

#[tokio::test]
async fn a_stalled_handshake_times_out() {
    let (client_end, _server_end) = tokio::io::duplex(4096);
    let (read, write) = tokio::io::split(client_end);
    let options = ClientOptions::default().request_timeout(Duration::from_millis(200));
    let connecting = AppServerClient::builder()
        .options(options)
        .connect(read, write);
    match tokio::time::timeout(HANG, connecting).await {
        Ok(Err(ClientError::Timeout { method, .. })) => assert_eq!(method, "initialize"),
        Ok(other) => panic!("expected a timeout, got {other:?}"),
        Err(_) => panic!("connecting to a silent server hung"),
    }
}

#[tokio::test]
async fn a_server_that_stops_reading_cannot_hang_requests_or_notifications() {
    let options = ClientOptions::default().request_timeout(Duration::from_millis(300));
    // A 1 KiB pipe the server never drains: after a dozen requests the client's writer blocks,
    // then its queue fills, then every new request waits to be queued.
    let (client, _server, _) = connect_over(options, 1024).await;
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .request_value("thread/read", Some(read_params(&i.to_string())))
                    .await
            })
        })
        .collect();
    let all = async {
        for call in calls {
            match call.await.unwrap() {
                Err(ClientError::Timeout { .. }) => {}
                other => panic!("expected a timeout, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(HANG, all)
        .await
        .expect("requests to a server that stopped reading hung");
    match tokio::time::timeout(HANG, client.notify("x/y", None)).await {
        Ok(Err(ClientError::Timeout { .. })) => {}
        Ok(other) => panic!("expected a timeout, got {other:?}"),
        Err(_) => panic!("a notification to a server that stopped reading hung"),
    }
}

/// Returns once no task of this runtime can go on (every one waits): the test runs on a paused
/// clock, which tokio moves on, and so ends this sleep, only then.
async fn settled() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_server_requests_is_bounded_when_answers_cannot_go_out() {
    let options = ClientOptions::default().max_pending_requests(8);
    let (_client, mut server, _) = connect_over(options, 64 * 1024).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    // The server sends approval requests and never reads the answers.
    let flood = tokio::spawn(async move {
        for i in 0..5_000 {
            server
                .send_raw(&json!({"id": 10_000 + i, "method": "item/commandExecution/requestApproval", "params": {"threadId": "t", "turnId": "u", "itemId": "i"}}).to_string())
                .await;
        }
        server
    });
    // The flood stops where the client stopped reading: every pipe full, every task waiting.
    settled().await;
    let alive = metrics.num_alive_tasks();
    // Reader, writer, the flood and at most `max_pending_requests` answers in flight.
    assert!(
        alive <= 8 + 8,
        "{alive} tasks alive: server requests pile up instead of being bounded"
    );
    assert!(
        !flood.is_finished(),
        "the reader kept reading although no answer could go out"
    );
    flood.abort();
}

#[tokio::test]
async fn a_notification_flood_for_a_thread_nobody_subscribed_to_is_dropped_not_buffered() {
    let (client, mut server, recorded) = connect_over(ClientOptions::default(), 64 * 1024).await;
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .request_value("thread/read", Some(read_params("x")))
                .await
        }
    });
    let (id, _) = server.expect("thread/read").await;
    // 50 000 notifications (several MiB) for a thread no one subscribed to, then the answer.
    // If the client kept them, the 64 KiB pipe would stall this loop; it drains them.
    let flood = async {
        for i in 0..50_000 {
            server
                .send_raw(&json!({"method": "item/agentMessage/delta", "params": {"threadId": "ghost", "turnId": "t", "itemId": "i", "delta": i.to_string()}}).to_string())
                .await;
        }
        server.reply(id, json!({"thread": {"id": "x"}})).await;
    };
    tokio::time::timeout(HANG, flood)
        .await
        .expect("the client stopped reading during a flood for an unknown thread");
    let value = tokio::time::timeout(HANG, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(value["thread"]["id"], "x");
    // Nothing is kept per dropped notification, not even a status event.
    assert!(
        recorded.events().len() < 10,
        "{:?}",
        recorded.events().len()
    );
}

#[tokio::test]
async fn an_endless_line_is_dropped_as_it_arrives() {
    let options = ClientOptions::default().max_line_length(4096);
    let (client, mut server, recorded) = connect_over(options, 64 * 1024).await;
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .request_value("thread/read", Some(read_params("x")))
                .await
        }
    });
    let (id, _) = server.expect("thread/read").await;
    // 16 MiB without a newline through a 64 KiB pipe: the client must discard as it reads.
    let chunk = vec![b'x'; 64 * 1024];
    let send = async {
        for _ in 0..256 {
            server.writer.write_all(&chunk).await.unwrap();
        }
        server.writer.write_all(b"\n").await.unwrap();
        server.reply(id, json!({"thread": {"id": "x"}})).await;
    };
    tokio::time::timeout(HANG, send)
        .await
        .expect("the client stopped reading an endless line");
    let value = tokio::time::timeout(HANG, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(value["thread"]["id"], "x");
    let warnings = recorded.messages(StatusKind::Warn);
    assert_eq!(
        warnings
            .iter()
            .filter(|m| m.contains("longer than the limit"))
            .count(),
        1,
        "{warnings:?}"
    );
}

async fn agent_session(
    options: ClientOptions,
    turn_timeout: Duration,
) -> (
    BindingStore,
    tokio::task::JoinHandle<Result<rethread_runtime::TurnReport, RuntimeError>>,
    Peer,
) {
    let (client, mut server, _) = connect_over(options, 64 * 1024).await;
    let store: BindingStore = BindingStore::memory();
    let agent_options = BinderOptions::default().turn_timeout(turn_timeout);
    let mut agent =
        SessionBinder::new("s", store.clone(), StatusRail::default()).with_options(agent_options);
    let turn = tokio::spawn(async move {
        let mut session = agent.open(&client).await?;
        session.run_turn("hello").await
    });
    let (id, _) = server.expect("thread/start").await;
    server
        .reply(id, json!({"thread": {"id": "thr_1", "turns": []}}))
        .await;
    let (id, _) = server.expect("turn/start").await;
    server
        .reply(
            id,
            json!({"turn": {"id": "turn_1", "status": "inProgress", "items": []}}),
        )
        .await;
    (store, turn, server)
}

async fn assert_nothing_written(store: &BindingStore) {
    assert_eq!(store.binding("s").await.unwrap(), None);
    assert!(store.all_rows("s").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_never_ending_turn_is_interrupted_at_the_turn_timeout_and_writes_nothing() {
    let (store, turn, server) =
        agent_session(ClientOptions::default(), Duration::from_millis(300)).await;
    let Peer {
        mut reader,
        mut writer,
    } = server;
    // The turn streams deltas forever and never completes; the interrupt is answered at once.
    let server = tokio::spawn(async move {
        let mut line = String::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        for i in 0u64.. {
            tokio::select! {
                read = reader.read_line(&mut line) => {
                    if read.unwrap_or(0) == 0 {
                        return None;
                    }
                    let message: Value = serde_json::from_str(&line).unwrap();
                    if message["method"] == "turn/interrupt" {
                        let answer = json!({"id": message["id"], "result": {}});
                        writer.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
                        return Some(message);
                    }
                    line.clear();
                }
                _ = tick.tick() => {
                    let delta = json!({"method": "item/agentMessage/delta", "params": {"threadId": "thr_1", "turnId": "turn_1", "itemId": "m", "delta": i.to_string()}});
                    if writer.write_all(format!("{delta}\n").as_bytes()).await.is_err() {
                        return None;
                    }
                }
            }
        }
        None
    });
    // Well within the 60 s request timeout: the interrupt's answer is read although the turn
    // still streams.
    match tokio::time::timeout(Duration::from_secs(10), turn).await {
        Ok(Ok(Err(RuntimeError::TurnFailed { status, .. }))) => assert_eq!(status, "timeout"),
        Ok(other) => panic!("expected a timed-out turn, got {other:?}"),
        Err(_) => panic!("a never-ending turn hung the host"),
    }
    let interrupt = server.await.unwrap().expect("turn/interrupt was sent");
    assert_eq!(interrupt["params"]["turnId"], "turn_1");
    assert_nothing_written(&store).await;
}

#[tokio::test]
async fn a_server_that_goes_silent_mid_turn_is_bounded_by_the_turn_timeout() {
    let options = ClientOptions::default().request_timeout(Duration::from_millis(200));
    let (store, turn, _server) = agent_session(options, Duration::from_millis(300)).await;
    // No notification ever comes, and the interrupt is not answered either.
    match tokio::time::timeout(HANG, turn).await {
        Ok(Ok(Err(RuntimeError::TurnFailed { status, .. }))) => assert_eq!(status, "timeout"),
        Ok(other) => panic!("expected a timed-out turn, got {other:?}"),
        Err(_) => panic!("a silent server hung the host"),
    }
    assert_nothing_written(&store).await;
}
