//! What the proxy's tests share: the one place that names the test harness crate, taps that record the bytes
//! crossing a stream, and a forwarder running in a task between a test client and any codex.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

pub use rethread_fake_appserver::{FakeAppServer, FakeHandle, Fault, FaultScript, Profile};
pub use rethread_testkit::faulty_store;
pub use rethread_testkit::real::{
    ask_for_approvals, codex_or_skip, error_of, find_codex, real_codex_required, rollout_files,
    thread_id, CodexHome, TurnRun, WirePeer,
};
pub use rethread_testkit::responses::ResponsesStandIn;
pub use rethread_testkit::{supported_releases, CURRENT};

use rethread_proxy::{forward, Ended, ProxyError, ProxyOptions, Reporter, SessionHooks};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;

/// `codex app-server` started as `rethread_proxy::spawn_app_server` starts it, but with codex's
/// stderr copied into this test's own output (shown when the test fails, or under
/// `--nocapture`) rather than inherited into the log of every passing run.
pub fn spawn_app_server(command: &rethread_proxy::CodexCommand) -> tokio::process::Child {
    use std::process::Stdio;
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .command("app-server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn codex app-server");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("codex stderr: {line}");
        }
    });
    child
}

/// Every supported release to run against (`codex-releases.txt`; a missing one fails in CI).
pub fn releases() -> Vec<(String, std::path::PathBuf)> {
    supported_releases()
        .into_iter()
        .filter_map(|version| codex_or_skip(&version).map(|path| (version, path)))
        .collect()
}

/// Bytes recorded by a tap.
pub type Recorded = Arc<Mutex<Vec<u8>>>;

/// Records every byte read through it.
pub struct TapRead<R> {
    inner: R,
    pub seen: Recorded,
}

impl<R: AsyncRead + Unpin> AsyncRead for TapRead<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        let new = buf.filled()[before..].to_vec();
        self.seen.lock().unwrap().extend_from_slice(&new);
        poll
    }
}

/// Records every byte written through it.
pub struct TapWrite<W> {
    inner: W,
    pub seen: Recorded,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for TapWrite<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &poll {
            self.seen.lock().unwrap().extend_from_slice(&buf[..*n]);
        }
        poll
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pub fn tap_read<R>(inner: R) -> (TapRead<R>, Recorded) {
    let seen = Recorded::default();
    (
        TapRead {
            inner,
            seen: seen.clone(),
        },
        seen,
    )
}

pub fn tap_write<W>(inner: W) -> (TapWrite<W>, Recorded) {
    let seen = Recorded::default();
    (
        TapWrite {
            inner,
            seen: seen.clone(),
        },
        seen,
    )
}

pub type TestClient = WirePeer<TapRead<ReadHalf<DuplexStream>>, TapWrite<WriteHalf<DuplexStream>>>;

/// A forwarder running in a task between a test client and a codex.
pub struct Proxied {
    /// The test's client.
    pub client: TestClient,
    /// The forwarder's result.
    pub task: JoinHandle<Result<Ended, ProxyError>>,
    /// What the proxy reported (its stderr lines).
    pub reports: Arc<Mutex<Vec<String>>>,
    /// Bytes the client sent and received.
    pub client_sent: Recorded,
    pub client_got: Recorded,
    /// Bytes codex wrote and read.
    pub codex_wrote: Recorded,
    pub codex_read: Recorded,
}

/// Options whose reporter records into `reports`.
pub fn recording_options(reports: &Arc<Mutex<Vec<String>>>) -> ProxyOptions {
    let sink = reports.clone();
    let mut options = ProxyOptions::default();
    options.reporter = Reporter::new(move |m| sink.lock().unwrap().push(m.to_string()));
    options
}

/// Starts `forward` with `hooks` between a new test client and codex's `codex_out` /
/// `codex_in`.
pub fn proxy<H, R, W>(
    hooks: Arc<H>,
    codex_out: R,
    codex_in: W,
    options: impl FnOnce(ProxyOptions) -> ProxyOptions,
) -> Proxied
where
    H: SessionHooks + 'static,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let reports = Arc::new(Mutex::new(Vec::new()));
    let options = options(recording_options(&reports));
    let (client_end, proxy_end) = tokio::io::duplex(64 * 1024);
    let (client_read, client_write) = tokio::io::split(client_end);
    let (client_read, client_got) = tap_read(client_read);
    let (client_write, client_sent) = tap_write(client_write);
    let (codex_out, codex_wrote) = tap_read(codex_out);
    let (codex_in, codex_read) = tap_write(codex_in);
    let (proxy_read, proxy_write) = tokio::io::split(proxy_end);
    let task = tokio::spawn(async move {
        forward(
            &*hooks,
            &options,
            proxy_read,
            proxy_write,
            codex_out,
            codex_in,
            std::future::pending(),
        )
        .await
    });
    Proxied {
        client: WirePeer::new(client_read, client_write),
        task,
        reports,
        client_sent,
        client_got,
        codex_wrote,
        codex_read,
    }
}

/// A forwarder with `hooks` between a new test client and the codex at the other end of
/// `stream` (an in-process fake's), with the default options.
pub fn connect<H: SessionHooks + 'static>(hooks: Arc<H>, stream: DuplexStream) -> Proxied {
    let (read, write) = tokio::io::split(stream);
    proxy(hooks, read, write, |o| o)
}

/// A forwarder in front of a new in-process fake app-server.
pub fn proxy_fake<H: SessionHooks + 'static>(
    hooks: Arc<H>,
    fake: rethread_fake_appserver::FakeBuilder,
) -> (Proxied, FakeHandle) {
    let (stream, handle) = fake.spawn_in_process().unwrap();
    let (read, write) = tokio::io::split(stream);
    (proxy(hooks, read, write, |o| o), handle)
}

/// Closes the client's input, reads what is left for it, and waits (10 s at most) for the
/// forwarder's end.
pub async fn close_client(mut proxied: Proxied) -> (Ended, Proxied) {
    proxied.client.close_writer().await;
    while proxied.client.next_message().await.unwrap().is_some() {}
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), &mut proxied.task)
        .await
        .expect("the forwarder ends")
        .unwrap()
        .expect("no error");
    (ended, proxied)
}

/// [`close_client`], failing unless the forwarder ended cleanly: the client closed, codex
/// finished.
pub async fn finish(proxied: Proxied) -> Proxied {
    let (ended, proxied) = close_client(proxied).await;
    assert_eq!(
        ended,
        Ended::ClientClosed {
            codex_finished: true
        }
    );
    proxied
}

/// The params of every `warning` notification in a client's log.
pub fn warnings(log: &[serde_json::Value]) -> Vec<serde_json::Value> {
    log.iter()
        .filter(|m| m["method"] == "warning")
        .map(|m| m["params"].clone())
        .collect()
}

/// The lines of recorded bytes.
pub fn lines(recorded: &Recorded) -> Vec<String> {
    String::from_utf8(recorded.lock().unwrap().clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The recorded bytes.
pub fn bytes(recorded: &Recorded) -> Vec<u8> {
    recorded.lock().unwrap().clone()
}

/// Sends `thread/start` in `/tmp` and returns the answer (an error answer included).
pub async fn start_thread<R, W>(peer: &mut WirePeer<R, W>) -> serde_json::Value
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    peer.start_thread().await.unwrap()
}

/// `initialize` (no experimental API), then `thread/start`: the new thread's id.
pub async fn open_thread<R, W>(peer: &mut WirePeer<R, W>) -> String
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    peer.initialize(false).await.unwrap();
    thread_id(&start_thread(peer).await)
}
