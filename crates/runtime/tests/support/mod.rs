//! A scripted peer as a channel pair: the test holds the server's end of an
//! in-memory duplex and answers, errors or stalls each request itself.

#![allow(dead_code, unreachable_pub)]

use rethread_protocol::{Message, RequestId, RpcError};
use rethread_runtime::{AppServerClient, ClientOptions, RecordedEvents, StatusRail};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};

pub struct Peer {
    pub reader: BufReader<ReadHalf<DuplexStream>>,
    pub writer: WriteHalf<DuplexStream>,
}

impl Peer {
    /// The next message the client sent.
    pub async fn recv(&mut self) -> Message {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).await.unwrap();
        assert!(n > 0, "client closed");
        serde_json::from_str(&line).unwrap()
    }

    /// The next line the client sent, or `None` once it hung up.
    pub async fn next_line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line).await.unwrap() {
            0 => None,
            _ => Some(line),
        }
    }

    /// The next request; returns its id and method and params.
    pub async fn request(&mut self) -> (RequestId, String, Value) {
        match self.recv().await {
            Message::Request(r) => (r.id, r.method, r.params.unwrap_or(Value::Null)),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    pub async fn expect(&mut self, method: &str) -> (RequestId, Value) {
        let (id, got, params) = self.request().await;
        assert_eq!(got, method);
        (id, params)
    }

    pub async fn send_raw(&mut self, line: &str) {
        self.writer.write_all(line.as_bytes()).await.unwrap();
        self.writer.write_all(b"\n").await.unwrap();
        self.writer.flush().await.unwrap();
    }

    pub async fn send(&mut self, message: &Message) {
        self.send_raw(&message.to_line()).await;
    }

    pub async fn reply(&mut self, id: RequestId, result: Value) {
        self.send(&Message::Response(rethread_protocol::jsonrpc::Response {
            id,
            result,
        }))
        .await;
    }

    pub async fn fail(&mut self, id: RequestId, code: i64, message: &str) {
        self.send(&Message::error(Some(id), RpcError::new(code, message)))
            .await;
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        self.send(&Message::notification(method, Some(params)))
            .await;
    }

    /// Answers `initialize` and consumes `initialized`.
    pub async fn handshake(&mut self) {
        let (id, params) = self.expect("initialize").await;
        assert_eq!(params["capabilities"]["experimentalApi"], true);
        self.reply(id, json!({"userAgent": "scripted/0.0.1"})).await;
        match self.recv().await {
            Message::Notification(n) => assert_eq!(n.method, "initialized"),
            other => panic!("expected initialized, got {other:?}"),
        }
    }

    /// Answers `thread/start` with a fresh thread `id`.
    pub async fn start_thread(&mut self, thread_id: &str) -> Value {
        let (id, params) = self.expect("thread/start").await;
        self.reply(id, json!({"thread": thread(thread_id), "model": "mock"}))
            .await;
        params
    }

    /// Answers the next `turn/start` with turn `turn_id` in progress; returns its params.
    pub async fn accept_turn(&mut self, turn_id: &str) -> Value {
        let (id, params) = self.expect("turn/start").await;
        self.reply(
            id,
            json!({"turn": {"id": turn_id, "status": "inProgress", "items": []}}),
        )
        .await;
        params
    }

    /// Runs a whole turn that replies `reply`.
    pub async fn run_turn(&mut self, thread_id: &str, turn_id: &str, reply: &str) {
        let params = self.accept_turn(turn_id).await;
        assert_eq!(params["threadId"], thread_id);
        let turn = json!({"id": turn_id, "status": "inProgress", "items": []});
        self.notify("turn/started", json!({"threadId": thread_id, "turn": turn}))
            .await;
        let item = json!({"type": "agentMessage", "id": "m1", "text": reply});
        self.notify(
            "item/completed",
            json!({"threadId": thread_id, "turnId": turn_id, "item": item, "completedAtMs": 1}),
        )
        .await;
        self.notify(
            "turn/completed",
            json!({"threadId": thread_id, "turn": {"id": turn_id, "status": "completed", "items": []}}),
        )
        .await;
    }

    /// Drops the server's end: the client sees EOF.
    pub fn hang_up(self) {}
}

/// A client of the app-server at the other end of `stream` (an in-process fake's), with the
/// default options, after the handshake.
pub async fn client_on(stream: DuplexStream) -> AppServerClient {
    let (reader, writer) = tokio::io::split(stream);
    AppServerClient::builder()
        .connect(reader, writer)
        .await
        .unwrap()
}

/// A lease holder on another machine: nothing here can judge whether it still runs.
pub fn remote_owner(host: &str) -> rethread_store::LeaseOwner {
    rethread_store::LeaseOwner {
        host: host.to_string(),
        pid: 4242,
        started_at_ms: 1_700_000_000_000,
        instance: 1,
        process: None,
    }
}

pub fn thread(id: &str) -> Value {
    json!({"id": id, "historyMode": "legacy", "turns": [], "preview": "", "cliVersion": "0.0.1"})
}

/// A connected client and the peer; the handshake is run.
pub async fn connect(options: ClientOptions) -> (AppServerClient, Peer, RecordedEvents) {
    connect_over(options, 1 << 20).await
}

/// [`connect`] over a duplex pipe of `pipe` bytes each way.
pub async fn connect_over(
    options: ClientOptions,
    pipe: usize,
) -> (AppServerClient, Peer, RecordedEvents) {
    let (client_end, server_end) = tokio::io::duplex(pipe);
    let (server_read, server_write) = tokio::io::split(server_end);
    let (client_read, client_write) = tokio::io::split(client_end);
    let mut peer = Peer {
        reader: BufReader::new(server_read),
        writer: server_write,
    };
    let (rail, recorded) = StatusRail::recording();
    let connecting = tokio::spawn(async move {
        AppServerClient::builder()
            .options(options)
            .rail(rail)
            .connect(client_read, client_write)
            .await
    });
    peer.handshake().await;
    let client = connecting.await.unwrap().unwrap();
    (client, peer, recorded)
}
