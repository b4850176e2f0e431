//! The forwarder: two readers, two writers and the hooks, run as one future (dropping it stops
//! everything; no task outlives it).
//!
//! ```text
//! client in ──► client reader ──(hooks.on_client_message)──► to-codex queue ──► codex writer ──► codex stdin
//! client out ◄── client writer ◄── to-client queue ◄──(hooks.on_server_message)── codex reader ◄── codex stdout
//!                                                      proxy answers ──► waiting CodexRequester
//! ```

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
use crate::line::{peek_prefix, Line, LineKind, Peek, Refused};
use crate::queue::{drain, queue};
use crate::{Ended, ProxyError, ProxyOptions};

/// Forwards lines between a client (`client_in` / `client_out`) and codex (`codex_out` /
/// `codex_in`) until one side ends (see [`Ended`]), `stop` resolves with a signal number, or a
/// hook fails ([`ProxyError::Hook`]), calling `hooks` on the way and
/// [`SessionHooks::on_shutdown`] in every case before it returns. Codex's process is the
/// caller's: this only closes codex's input.
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
    let reporter = options.reporter.clone();
    let link = Link::new(to_codex, to_client, options.request_timeout, reporter);
    let (client_ctx, server_ctx) = ClientContext::new(link.clone());
    let limit = options.max_line_length;

    let run = async {
        hooks
            .on_start(&client_ctx)
            .await
            .map_err(ProxyError::Hook)?;
        let framer = LineFramer::new(limit);
        let client_lines = FramedRead::with_capacity(client_in, framer, options.read_buffer);
        let client_reader = client_side(hooks, &client_ctx, &link, client_lines, limit);
        let framer = LineFramer::new(limit).eliding(RESUME_TURNS);
        let codex_lines = FramedRead::with_capacity(codex_out, framer, options.read_buffer);
        let codex_reader = codex_side(hooks, &server_ctx, &link, codex_lines, limit);
        let client_writer = drain(to_client_rx, client_out, options.write_buffer);
        let codex_writer = drain(to_codex_rx, codex_in, options.write_buffer);
        tokio::pin!(
            client_reader,
            codex_reader,
            client_writer,
            codex_writer,
            stop
        );

        // `client_read`: the client side stopped; `client_ended`: because its input ended.
        let (mut client_read, mut client_ended, mut codex_ended) = (false, false, false);
        let (mut client_closed, mut codex_written) = (false, false);
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
                // Once both readers are done, the client's output can close. A branch, not an
                // await in an arm body: the close waits for room in a full queue, which only
                // the client writer makes, so it and `stop` must go on being polled.
                () = link.to_client.close(), if codex_ended && client_read && !client_closed => {
                    client_closed = true;
                }
                result = &mut client_writer => {
                    if let Err(error) = result {
                        if !client_ended {
                            link.reporter
                                .report(&format!("the client stopped reading: {error}"));
                        }
                        return Ok(Ended::ClientGone);
                    }
                    // The client writer only finishes cleanly after codex's output ended.
                    return Ok(if client_ended {
                        Ended::ClientClosed {
                            codex_finished: true,
                        }
                    } else {
                        Ended::CodexClosed
                    });
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
#[derive(Clone, Copy, PartialEq, Eq)]
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

/// The next whole line `peer` sent (the `Bytes` split off the read buffer), or `None` once its
/// input ended or failed (reported). A line over `limit` is answered in place or dropped here.
async fn next_line<R: AsyncRead + Unpin>(
    lines: &mut FramedRead<R, LineFramer>,
    link: &Link,
    peer: Peer,
    limit: usize,
) -> Option<Bytes> {
    loop {
        match lines.next().await? {
            Ok(Frame::Line(bytes)) => return Some(bytes),
            Ok(Frame::TooLong { prefix, elided }) => {
                let sender = peek_prefix(&prefix);
                if peer == Peer::Codex && own_resume_answer(link, sender.as_ref(), elided, limit) {
                    continue;
                }
                let (code, problem) = match peer {
                    Peer::Client => (
                        ErrorCode::INVALID_REQUEST,
                        format!("is longer than rethread's line limit of {limit} bytes"),
                    ),
                    Peer::Codex => (
                        ErrorCode::INTERNAL_ERROR,
                        format!("is longer than the limit of {limit} bytes"),
                    ),
                };
                let refused = Refused {
                    code,
                    problem,
                    sender,
                };
                answer_in_place(link, peer, refused, limit).await;
            }
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
                answer_in_place(link, Peer::Client, refused, limit).await;
                continue;
            }
        };
        // A send fails only once its side is gone, which ends the run.
        if line.kind() == LineKind::Other {
            // Codex ignores a line it cannot read, as it would without us in between.
            report_unrouted(link, Peer::Client, &line);
            let _ = link.to_codex.send(line.into_bytes()).await;
            continue;
        }
        if uses_reserved_id(&line) {
            let error = RpcError::new(
                ErrorCode::INVALID_REQUEST,
                format!("request ids starting with {PROXY_ID_PREFIX:?} are reserved by rethread"),
            );
            let answer = Line::error_response(line.id().cloned(), error);
            let _ = link.to_client.send(answer.into_bytes()).await;
            continue;
        }
        let action = hooks.on_client_message(&line, ctx).await;
        if action.map_err(ProxyError::Hook)? == ClientAction::Forward {
            let _ = link.to_codex.send(line.into_bytes()).await;
        }
    }
    link.to_codex.close().await;
    Ok(ClientEnd::InputEnded)
}

/// Why the client side stopped reading.
enum ClientEnd {
    InputEnded,
    /// Codex's output ended (and no hook call was running).
    CodexGone,
}

/// Reads codex's lines until its output ends; then waiting requests fail, and the client's
/// output is closed once the client side is idle.
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
            link.deliver_or_report(&id, line);
            continue;
        }
        if line.kind() == LineKind::Other {
            report_unrouted(link, Peer::Codex, &line);
        } else if hooks
            .on_server_message(&line, ctx)
            .await
            .map_err(ProxyError::Hook)?
            == ServerAction::Consumed
        {
            continue;
        }
        let _ = link.to_client.send(line.into_bytes()).await;
    }
    link.close();
    Ok(())
}

fn report_unrouted(link: &Link, from: Peer, line: &Line) {
    const SHOWN: usize = 80;
    let json = line.json();
    if json.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let shown = String::from_utf8_lossy(&json[..json.len().min(SHOWN)]);
    let more = if json.len() > SHOWN { "..." } else { "" };
    link.reporter.report(&format!(
        "passed on a line from {} that is not a JSON-RPC message ({} bytes): {shown}{more}",
        from.name(),
        json.len()
    ));
}

/// A line the proxy does not pass on (`problem` says why, e.g. "is not UTF-8"): whoever waits
/// for it, when it names an id, gets an error in its place, so that nothing waits forever: a
/// request's sender, or the requester of an answer (the client, codex, or the proxy itself
/// for its own ids). Otherwise the line is dropped. Either way it is reported.
async fn answer_in_place(link: &Link, from: Peer, refused: Refused, limit: usize) {
    let Refused {
        code,
        problem,
        sender,
    } = refused;
    let codex_too_long =
        || format!("codex's message was longer than rethread's line limit of {limit} bytes");
    let Some(peek) = sender else {
        let from = from.name();
        return link
            .reporter
            .report(&format!("dropped a line from {from} that {problem}"));
    };
    let id = display_id(&peek.id);
    let request = peek.kind == LineKind::Request;
    let (report, message) = match (from, request) {
        (Peer::Client, true) => (
            format!(
                "refused a request from the client that {problem} (id {id}, {}); answered it \
                 with an error",
                peek.method.as_deref().unwrap_or("?")
            ),
            format!("the request line {problem}"),
        ),
        (Peer::Client, false) => (
            format!("the client's answer to codex's request {id} {problem}; codex gets an error instead"),
            format!("the client's answer {problem}"),
        ),
        (Peer::Codex, true) => (
            format!(
                "codex's request {id} ({}) {problem}; answered it with an error",
                peek.method.as_deref().unwrap_or("?")
            ),
            codex_too_long(),
        ),
        (Peer::Codex, false) => (
            format!("codex's answer to {id} {problem}; its requester gets an error instead"),
            codex_too_long(),
        ),
    };
    link.reporter.report(&report);
    let answer = Line::error_response(peek.id, RpcError::new(code, message));
    // A request is answered to its sender; an answer's requester is on the other side.
    let to_client = (from == Peer::Client) == request;
    if !to_client {
        let _ = link.to_codex.send(answer.into_bytes()).await;
    } else if let Some(id) = proxy_answer_id(&answer) {
        let id = id.to_string();
        link.deliver(&id, answer);
    } else {
        let _ = link.to_client.send(answer.into_bytes()).await;
    }
}

/// What the codex side's framer leaves out of an oversized line: the turns of a
/// `thread/resume` answer, which the proxy drops anyway (`session/start.rs`).
const RESUME_TURNS: &[&str] = &["result", "thread", "turns"];

/// An oversized codex line whose copy without its turns (`elided`) is the answer to the
/// proxy's own request that its prefix names: delivered that way. False for any other line.
fn own_resume_answer(
    link: &Link,
    sender: Option<&Peek>,
    elided: Option<Bytes>,
    limit: usize,
) -> bool {
    let (Some(peek), Some(elided)) = (sender, elided) else {
        return false;
    };
    let line = Line::new(elided);
    let Some(id) = proxy_answer_id(&line) else {
        return false;
    };
    if line.kind() != LineKind::Response || peek.id != Some(RequestId::String(id.to_string())) {
        return false;
    }
    let id = id.to_string();
    link.reporter.report(&format!(
        "codex's answer to {id} is longer than the limit of {limit} bytes; the proxy took it \
         without the thread's turns"
    ));
    link.deliver_or_report(&id, line);
    true
}

fn display_id(id: &Option<RequestId>) -> String {
    id.as_ref()
        .map_or_else(|| "null".to_string(), ToString::to_string)
}
