//! The forwarder in front of the real codex (every pinned release, and the newest when
//! installed), offline through the Responses-API stand-in: a turn that asks for an approval
//! passes byte-for-byte both ways while the client uses integer and UUID ids and the proxy
//! makes requests of its own in between; and a client sees the same turn directly and
//! through the proxy.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rethread_proxy::{
    ClientAction, ClientContext, CodexCommand, Ended, HookError, Line, LineKind, SessionHooks,
};
use serde_json::json;
use support::*;

/// Before forwarding each client request after `initialize`, asks codex for `thread/list`
/// itself.
#[derive(Debug, Default)]
struct Interleaves {
    initialized: std::sync::atomic::AtomicBool,
    answered: AtomicUsize,
}

impl SessionHooks for Interleaves {
    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.method() == Some("initialized") {
            self.initialized.store(true, Ordering::SeqCst);
        }
        if line.kind() == LineKind::Request && self.initialized.load(Ordering::SeqCst) {
            let listed = ctx.request("thread/list", Some(json!({}))).await?;
            assert!(listed.get("data").is_some(), "{listed}");
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
        Ok(ClientAction::Forward)
    }
}

fn spawn_codex(codex: &Path, home: &Path) -> tokio::process::Child {
    spawn_app_server(
        &CodexCommand::new(codex)
            .args(["--listen", "stdio://"])
            .env("CODEX_HOME", home)
            .env("RUST_LOG", "error"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_turn_passes_byte_for_byte_with_interleaved_proxy_requests() {
    for (version, codex) in releases() {
        let model = ResponsesStandIn::start().unwrap();
        model.push_escalated_command("echo approved");
        let home = CodexHome::new(&model).unwrap();
        ask_for_approvals(home.path()).unwrap();
        let mut child = spawn_codex(&codex, home.path());
        let hooks = Arc::new(Interleaves::default());
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let mut proxied = proxy(hooks.clone(), stdout, stdin, |o| o);
        let client = &mut proxied.client;

        let init = client.initialize(true).await.unwrap();
        let agent = init["result"]["userAgent"].as_str().unwrap_or_default();
        assert!(agent.contains(&version), "{version}: {init}");
        // A UUID string id for the start, integer ids elsewhere.
        let start_id = json!("6f0e3a52-5d0c-4a3e-9a57-0e1f2a3b4c5d");
        client
            .send(&json!({"id": start_id, "method": "thread/start", "params": {"cwd": "/tmp"}}))
            .await
            .unwrap();
        let started = client.response_to(&start_id).await.unwrap();
        let thread = thread_id(&started);
        let turn = client
            .run_turn(&thread, "run it", Some(json!({"decision": "accept"})))
            .await
            .unwrap();
        assert_eq!(turn.status().as_deref(), Some("completed"), "{version}");
        let approval = turn
            .messages
            .iter()
            .find(|m| m.get("id").is_some() && m.get("method").is_some())
            .unwrap_or_else(|| panic!("{version}: no approval request reached the client"));
        assert_eq!(
            approval["method"], "item/commandExecution/requestApproval",
            "{version}"
        );
        // (Whether codex reports the command item before `turn/completed` is its own race,
        // seen both ways under 0.144.6; what the proxy owes is that the request reached the
        // client and the answer reached codex byte for byte, checked below.)

        proxied.client.close_writer().await;
        while proxied.client.next_message().await.unwrap().is_some() {}
        let ended = tokio::time::timeout(Duration::from_secs(15), &mut proxied.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            ended,
            Ended::ClientClosed {
                codex_finished: true
            },
            "{version}"
        );
        assert!(child.wait().await.unwrap().success(), "{version}");
        // thread/start and turn/start were preceded by a request of the proxy's own.
        assert_eq!(hooks.answered.load(Ordering::SeqCst), 2, "{version}");
        // Codex read the client's bytes plus the proxy's requests, in between.
        let own: Vec<String> = lines(&proxied.codex_read)
            .into_iter()
            .filter(|l| l.contains("\"id\":\"rethread-proxy:"))
            .collect();
        assert_eq!(own.len(), 2, "{version}");
        let mut from_client = lines(&proxied.codex_read);
        from_client.retain(|l| !own.contains(l));
        assert_eq!(from_client, lines(&proxied.client_sent), "{version}");
        let answer = format!(
            "{{\"id\":{},\"result\":{{\"decision\":\"accept\"}}}}",
            approval["id"]
        );
        assert!(from_client.contains(&answer), "{version}");
        // The client read every byte codex wrote except the answers to the proxy.
        let mut to_client = lines(&proxied.codex_wrote);
        to_client.retain(|l| !l.starts_with("{\"id\":\"rethread-proxy:"));
        assert_eq!(to_client.len(), lines(&proxied.codex_wrote).len() - 2);
        assert_eq!(lines(&proxied.client_got), to_client, "{version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_the_same_turn_directly_and_through_the_proxy() {
    /// What a client can rely on from a turn: the types of the items completed, the reply
    /// and the final status. (Codex races status notifications against items, so the whole
    /// method sequence differs from run to run even without a proxy.)
    async fn turn_summary(client: &mut TestClientOrDirect) -> (Vec<String>, Vec<String>, String) {
        client.initialize(true).await.unwrap();
        let started = start_thread(client).await;
        let thread = thread_id(&started);
        let turn = client.run_turn(&thread, "hello there", None).await.unwrap();
        let items = turn
            .messages
            .iter()
            .filter(|m| m["method"] == "item/completed")
            .map(|m| {
                m["params"]["item"]["type"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        (items, turn.agent_text(), turn.status().unwrap_or_default())
    }
    type TestClientOrDirect = WirePeer<
        Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
    >;

    for (version, codex) in releases() {
        let model = ResponsesStandIn::start().unwrap();
        let direct_home = CodexHome::new(&model).unwrap();
        let mut direct_child = spawn_codex(&codex, direct_home.path());
        let mut direct: TestClientOrDirect = WirePeer::new(
            Box::new(direct_child.stdout.take().unwrap()),
            Box::new(direct_child.stdin.take().unwrap()),
        );
        let direct_summary = turn_summary(&mut direct).await;

        let home = CodexHome::new(&model).unwrap();
        let mut child = spawn_codex(&codex, home.path());
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let (codex_end, proxy_end) = tokio::io::duplex(64 * 1024);
        let (proxy_read, proxy_write) = tokio::io::split(proxy_end);
        let hooks = rethread_proxy::NoSession::new();
        let options = rethread_proxy::ProxyOptions::default();
        let forwarder = tokio::spawn(async move {
            rethread_proxy::forward(
                &hooks,
                &options,
                proxy_read,
                proxy_write,
                stdout,
                stdin,
                std::future::pending(),
            )
            .await
        });
        let (read, write) = tokio::io::split(codex_end);
        let mut through: TestClientOrDirect = WirePeer::new(Box::new(read), Box::new(write));
        let through_summary = turn_summary(&mut through).await;
        assert_eq!(direct_summary.2, "completed", "{version}");
        assert_eq!(direct_summary, through_summary, "{version}");
        assert_eq!(
            through_summary.1,
            ["echo: hello there"],
            "{version}: the model's reply"
        );
        through.close_writer().await;
        let _ = tokio::time::timeout(Duration::from_secs(15), forwarder).await;
        let _ = direct_child.kill().await;
    }
}
