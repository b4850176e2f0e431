//! The forwarder: two readers, two writers and the hooks, run as one future.
//!
//! ```text
//! client in ──► client reader ──(hooks.on_client_message)──► to-codex queue ──► codex writer ──► codex stdin
//! client out ◄── client writer ◄── to-client queue ◄──(hooks.on_server_message)── codex reader ◄── codex stdout
//!                                                      proxy answers ──► waiting CodexRequester
//! ```
//!
//! Everything runs inside the one future [`forward`] returns: dropping it stops everything,
//! and no task outlives it.

use std::future::Future;

use bytes::Bytes;
use futures::StreamExt;
use rethread_protocol::codec::{Frame, LineFramer};
use rethread_protocol::{ErrorCode, RequestId, RpcError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use crate::hooks::{
    proxy_answer_id, uses_reserved_id, ClientAction, ClientContext, Link, ServerAction,
    ServerContext, SessionHooks, PROXY_ID_PREFIX,
};
use crate::line::{peek_prefix, Line, LineKind, Peek, Refusal};
use crate::queue::{drain, queue};
use crate::{Ended, ProxyError, ProxyOptions};

/// Forwards lines between a client (`client_in` / `client_out`) and codex (`codex_out` /
/// `codex_in`) until one side ends or `stop` resolves (with a signal number), calling `hooks`
/// on the way. Codex's process is the caller's: this function only closes codex's input.
///
/// How it ends:
/// - the client's input ends: everything read is forwarded, codex's input is closed, and
///   codex's output is still passed on until it ends or `options.shutdown_grace` passes
///   ([`Ended::ClientClosed`]);
/// - codex's output ends: everything it wrote is passed on and flushed to the client, after a
///   hook call then running has finished and what it queued with it ([`Ended::CodexClosed`]);
/// - writing to the client fails ([`Ended::ClientGone`]);
/// - `stop` resolves ([`Ended::Stopped`]);
/// - a hook returns an error ([`ProxyError::Hook`]).
///
/// [`SessionHooks::on_shutdown`] is called in every case, before this returns.
#[allow(clippy::too_many_arguments)]
pub async fn forward<H, CR, CW, XR, XW, S>(
    hooks: &H,
    options: &ProxyOptions,
    client_in: CR,
    client_out: CW,
    codex_out: XR,
    codex_in: XW,
    stop: S,
) -> Result<Ended, ProxyError>
where
    H: SessionHooks,
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    XR: AsyncRead + Unpin,
    XW: AsyncWrite + Unpin,
    S: Future<Output = i32>,
{
    let (to_codex, to_codex_rx) = queue(options.queue_lines, options.queue_bytes);
    let (to_client, to_client_rx) = queue(options.queue_lines, options.queue_bytes);
    let link = Link::new(
        to_codex,
        to_client,
        options.request_timeout,
        options.reporter.clone(),
    );
    let client_ctx = ClientContext::new(link.clone());
    let server_ctx = ServerContext::new(link.clone());

    let run = async {
        hooks
            .on_start(&client_ctx)
            .await
            .map_err(ProxyError::Hook)?;
        let client_reader = client_side(
            hooks,
            &client_ctx,
            &link,
            FramedRead::with_capacity(
                client_in,
                LineFramer::new(options.max_line_length),
                options.read_buffer,
            ),
            options.max_line_length,
        );
        let codex_reader = codex_side(
            hooks,
            &server_ctx,
            &link,
            FramedRead::with_capacity(
                codex_out,
                LineFramer::new(options.max_line_length).eliding(RESUME_TURNS),
                options.read_buffer,
            ),
            options.max_line_length,
        );
        let client_writer = drain(to_client_rx, client_out, options.write_buffer);
        let codex_writer = drain(to_codex_rx, codex_in, options.write_buffer);
        tokio::pin!(
            client_reader,
            codex_reader,
            client_writer,
            codex_writer,
            stop
        );

        // `client_read`: the client side stopped reading; `client_ended`: because its input
        // ended (not because codex's output did).
        let (mut client_read, mut client_ended, mut codex_ended) = (false, false, false);
        let (mut client_written, mut codex_written) = (false, false);
        let mut client_closed = false;
        let mut deadline: Option<Instant> = None;
        loop {
            tokio::select! {
                signal = &mut stop => return Ok(Ended::Stopped { signal }),
                result = &mut client_reader, if !client_read => {
                    client_read = true;
                    if let ClientEnd::InputEnded = result? {
                        client_ended = true;
                        deadline = Some(Instant::now() + options.shutdown_grace);
                    }
                }
                result = &mut codex_reader, if !codex_ended => {
                    result?;
                    codex_ended = true;
                }
                // Once both readers are done, everything for the client is queued and its
                // output can close. A branch, not an await in an arm body: the close waits for
                // room in a full queue, which only the client writer makes, so it and `stop`
                // must go on being polled meanwhile.
                () = link.to_client.close(), if codex_ended && client_read && !client_closed => {
                    client_closed = true;
                }
                result = &mut client_writer, if !client_written => {
                    client_written = true;
                    if let Err(error) = result {
                        if !client_ended {
                            link.reporter
                                .report(&format!("the client stopped reading: {error}"));
                        }
                        return Ok(Ended::ClientGone);
                    }
                }
                result = &mut codex_writer, if !codex_written => {
                    codex_written = true;
                    if let Err(error) = result {
                        // Codex closed its input, most likely exiting: its output says the rest.
                        link.reporter.report(&format!("writing to codex failed: {error}"));
                    }
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    return Ok(Ended::ClientClosed { codex_finished: false });
                }
            }
            if client_written {
                // The client writer only finishes cleanly after codex's output ended.
                return Ok(if client_ended {
                    Ended::ClientClosed {
                        codex_finished: true,
                    }
                } else {
                    Ended::CodexClosed
                });
            }
        }
    };
    let ended = run.await;
    link.close();
    hooks.on_shutdown().await;
    ended
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The side of the proxy a reader reads from.
#[derive(Clone, Copy)]
enum Peer {
    Client,
    Codex,
}

impl Peer {
    /// How reports name this side.
    fn name(self) -> &'static str {
        match self {
            Peer::Client => "the client",
            Peer::Codex => "codex",
        }
    }
}

/// The next whole line `peer` sent, or `None` once its input ended or failed (a failure is
/// reported). A line over `limit` is answered or dropped here, as its sender's side requires, and
/// reading goes on; whole lines come back as the `Bytes` split off the read buffer, uncopied.
async fn next_line<R: AsyncRead + Unpin>(
    lines: &mut FramedRead<R, LineFramer>,
    link: &Link,
    peer: Peer,
    limit: usize,
) -> Option<Bytes> {
    loop {
        match lines.next().await? {
            Ok(Frame::Line(bytes)) => return Some(bytes),
            Ok(Frame::TooLong { prefix, elided }) => match peer {
                Peer::Client => {
                    let problem = format!("is longer than rethread's line limit of {limit} bytes");
                    let sender = peek_prefix(&prefix);
                    refuse_from_client(link, sender, ErrorCode::INVALID_REQUEST, &problem).await;
                }
                Peer::Codex => oversized_from_codex(link, &prefix, elided, limit).await,
            },
            Err(error) => {
                link.reporter
                    .report(&format!("reading from {} failed: {error}", peer.name()));
                return None;
            }
        }
    }
}

/// Reads the client's lines until its input ends (then closes codex's input), or until codex's
/// output has ended while no hook call was running.
async fn client_side<H: SessionHooks, R: AsyncRead + Unpin>(
    hooks: &H,
    ctx: &ClientContext,
    link: &Link,
    mut lines: FramedRead<R, LineFramer>,
    limit: usize,
) -> Result<ClientEnd, ProxyError> {
    loop {
        // A hook call is never cut short by codex's end: the hook finishes (its requests fail
        // at once) and what it queued for the client still goes out.
        let bytes = tokio::select! {
            biased;
            () = link.codex_gone() => return Ok(ClientEnd::CodexGone),
            bytes = next_line(&mut lines, link, Peer::Client, limit) => bytes,
        };
        let Some(bytes) = bytes else { break };
        let line = match Line::from_client(bytes) {
            Ok(line) => line,
            Err(refused) => {
                let (code, problem) = match refused.why {
                    Refusal::NotUtf8 { valid_up_to } => (
                        ErrorCode::PARSE_ERROR,
                        format!("is not UTF-8 (invalid byte at offset {valid_up_to})"),
                    ),
                    Refusal::Duplicate { member } => (
                        ErrorCode::INVALID_REQUEST,
                        format!("has a duplicate `{member}` member"),
                    ),
                };
                refuse_from_client(link, refused.sender, code, &problem).await;
                continue;
            }
        };
        if line.kind() == LineKind::Other {
            report_unrouted(link, Peer::Client.name(), &line);
            // Codex ignores a line it cannot read, as it would without us in between. A send
            // fails only once codex's input is gone; codex's output then ends the run.
            let _ = link.to_codex.send(line.into_bytes()).await;
            continue;
        }
        if uses_reserved_id(&line) {
            let error = RpcError::new(
                ErrorCode::INVALID_REQUEST,
                format!("request ids starting with {PROXY_ID_PREFIX:?} are reserved by rethread"),
            );
            let _ = link
                .to_client
                .send(Line::error_response(line.id().cloned(), error).into_bytes())
                .await;
            continue;
        }
        match hooks
            .on_client_message(&line, ctx)
            .await
            .map_err(ProxyError::Hook)?
        {
            ClientAction::Forward => {
                let _ = link.to_codex.send(line.into_bytes()).await;
            }
            ClientAction::Consumed => {}
        }
    }
    link.to_codex.close().await;
    Ok(ClientEnd::InputEnded)
}

/// Why the client side stopped reading.
enum ClientEnd {
    /// The client's input ended.
    InputEnded,
    /// Codex's output ended (and no hook call was running).
    CodexGone,
}

/// Reads codex's lines until its output ends, then closes the client's output.
async fn codex_side<H: SessionHooks, R: AsyncRead + Unpin>(
    hooks: &H,
    ctx: &ServerContext,
    link: &Link,
    mut lines: FramedRead<R, LineFramer>,
    limit: usize,
) -> Result<(), ProxyError> {
    while let Some(bytes) = next_line(&mut lines, link, Peer::Codex, limit).await {
        let line = Line::new(bytes);
        if let Some(id) = proxy_answer_id(&line) {
            let id = id.to_string();
            if link.deliver(&id, line).is_err() {
                link.reporter.report(&format!(
                    "dropped codex's answer to {id:?}: the proxy no longer waits for it"
                ));
            }
            continue;
        }
        if line.kind() == LineKind::Other {
            report_unrouted(link, Peer::Codex.name(), &line);
            let _ = link.to_client.send(line.into_bytes()).await;
            continue;
        }
        match hooks
            .on_server_message(&line, ctx)
            .await
            .map_err(ProxyError::Hook)?
        {
            ServerAction::Forward => {
                // Fails only once the client's output is gone; the run then ends.
                let _ = link.to_client.send(line.into_bytes()).await;
            }
            ServerAction::Consumed => {}
        }
    }
    // Waiting requests fail now; the client's output is closed once the client side is idle.
    link.close();
    Ok(())
}

fn report_unrouted(link: &Link, from: &str, line: &Line) {
    if line.json().iter().all(u8::is_ascii_whitespace) {
        return;
    }
    const SHOWN: usize = 80;
    let json = line.json();
    let shown = String::from_utf8_lossy(&json[..json.len().min(SHOWN)]);
    let more = if json.len() > SHOWN { "..." } else { "" };
    link.reporter.report(&format!(
        "passed on a line from {from} that is not a JSON-RPC message ({} bytes): {shown}{more}",
        json.len()
    ));
}

/// A client line the proxy does not pass on (`problem` says why, e.g. "is not UTF-8"): its
/// sender, when the line names one, gets an error in its place: the client for a request, codex
/// for the client's answer to a server request (so that the request does not wait forever).
/// Otherwise the line is dropped. Either way it is reported.
async fn refuse_from_client(link: &Link, sender: Option<Peek>, code: ErrorCode, problem: &str) {
    match sender {
        Some(peek) if peek.kind == LineKind::Request => {
            link.reporter.report(&format!(
                "refused a request from the client that {problem} (id {}, {}); answered it \
                 with an error",
                display_id(&peek.id),
                peek.method.as_deref().unwrap_or("?")
            ));
            let error = RpcError::new(code, format!("the request line {problem}"));
            let answer = Line::error_response(peek.id, error);
            let _ = link.to_client.send(answer.into_bytes()).await;
        }
        Some(peek) => {
            link.reporter.report(&format!(
                "the client's answer to codex's request {} {problem}; codex gets an error \
                 instead",
                display_id(&peek.id)
            ));
            let error = RpcError::new(code, format!("the client's answer {problem}"));
            let answer = Line::error_response(peek.id, error);
            let _ = link.to_codex.send(answer.into_bytes()).await;
        }
        None => link
            .reporter
            .report(&format!("dropped a line from the client that {problem}")),
    }
}

/// What the codex side's framer leaves out of an oversized line: the turns of a
/// `thread/resume` answer. The proxy's own resume answers are all it uses that copy for, and it
/// answers the client's start with no turns anyway (`session/start.rs`).
const RESUME_TURNS: &[&str] = &["result", "thread", "turns"];

/// A codex line over the limit: whoever waits for it gets an error in its place, except that
/// the proxy's own request takes the copy without its turns (`elided`) when that is its answer.
async fn oversized_from_codex(link: &Link, prefix: &[u8], elided: Option<Bytes>, limit: usize) {
    let peek = peek_prefix(prefix);
    if let (Some(peek), Some(elided)) = (&peek, elided) {
        let line = Line::new(elided);
        let own = proxy_answer_id(&line)
            .filter(|id| matches!(&peek.id, Some(RequestId::String(named)) if named == id));
        if let (Some(id), LineKind::Response) = (own, line.kind()) {
            let id = id.to_string();
            link.reporter.report(&format!(
                "codex's answer to {id} is longer than the limit of {limit} bytes; the proxy \
                 took it without the thread's turns"
            ));
            if link.deliver(&id, line).is_err() {
                link.reporter.report(&format!(
                    "dropped codex's answer to {id:?}: the proxy no longer waits for it"
                ));
            }
            return;
        }
    }
    let error = RpcError::new(
        ErrorCode::INTERNAL_ERROR,
        format!("codex's message was longer than rethread's line limit of {limit} bytes"),
    );
    match peek {
        Some(peek) if peek.kind.is_answer() => {
            let answer = Line::error_response(peek.id.clone(), error);
            match proxy_answer_id(&answer) {
                Some(id) => {
                    let id = id.to_string();
                    let _ = link.deliver(&id, answer);
                }
                None => {
                    let _ = link.to_client.send(answer.into_bytes()).await;
                }
            }
            link.reporter.report(&format!(
                "codex's answer to {} is longer than the limit of {limit} bytes; its requester \
                 gets an error instead",
                display_id(&peek.id)
            ));
        }
        Some(peek) => {
            link.reporter.report(&format!(
                "codex's request {} ({}) is longer than the limit of {limit} bytes; answered it \
                 with an error",
                display_id(&peek.id),
                peek.method.as_deref().unwrap_or("?")
            ));
            let answer = Line::error_response(peek.id, error);
            let _ = link.to_codex.send(answer.into_bytes()).await;
        }
        None => link.reporter.report(&format!(
            "dropped a line from codex longer than the limit of {limit} bytes"
        )),
    }
}

fn display_id(id: &Option<rethread_protocol::RequestId>) -> String {
    id.as_ref()
        .map_or_else(|| "null".to_string(), ToString::to_string)
}
