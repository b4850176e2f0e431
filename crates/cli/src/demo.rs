//! `rethread demo`: the whole story on an embedded redb store and the bundled fake
//! app-server, narrated. Needs nothing installed; every claim it narrates is checked, and a
//! failed check fails the demo.

use std::sync::Arc;

use rethread_fake_appserver::faults::Corruption;
use rethread_fake_appserver::{FakeAppServer, FakeHandle};
use rethread_runtime::{
    AppServerClient, BinderOptions, OpenOutcome, SessionBinder, StatusKind, StatusRail,
};
use rethread_store::{BindingStore, BindingStoreExt, OpenOptions, RedbStore};
use tokio::io::DuplexStream;

use crate::{output, CliResult};

const SESSION: &str = "demo-session";

fn step(title: &str) {
    println!();
    println!("{}", output::paint("1", &format!("== {title}")));
}

fn check(ok: bool, what: &str) -> CliResult {
    if ok {
        println!("   ok: {what}");
        Ok(())
    } else {
        Err(format!("demo check failed: {what}").into())
    }
}

async fn connect(stream: DuplexStream, rail: StatusRail) -> CliResult<AppServerClient> {
    let (reader, writer) = tokio::io::split(stream);
    Ok(AppServerClient::builder()
        .rail(rail)
        .connect(reader, writer)
        .await?)
}

/// One "process": a fresh client on the fake and a fresh binder, one turn.
async fn turn(
    store: &Arc<dyn BindingStore>,
    stream: DuplexStream,
    home: &str,
    message: &str,
) -> CliResult<(OpenOutcome, String, Vec<String>)> {
    let (rail, recorded) = StatusRail::recording();
    let client = connect(stream, rail.clone()).await?;
    let options = BinderOptions {
        codex_home: Some(home.to_string()),
        ..Default::default()
    };
    let mut binder = SessionBinder::new(SESSION, store.clone(), rail).with_options(options);
    let mut session = binder.open(&client).await?;
    println!("   user: {message}");
    let report = session.run_turn(message).await?;
    println!("   codex: {}", report.reply);
    let notices = recorded.messages(StatusKind::Lifecycle);
    for notice in &notices {
        // Narration goes to stdout in order with the rest of the story.
        println!("   {}", output::paint("33", &format!("notice: {notice}")));
    }
    let outcome = session.outcome().clone();
    drop(session);
    // This "process" ends: the next one takes the session's lease at once.
    binder.close().await?;
    Ok((outcome, report.reply, notices))
}

fn model_saw(fake: &FakeHandle, word: &str) -> bool {
    fake.model_requests()
        .last()
        .is_some_and(|request| request.saw(word))
}

pub(crate) async fn run() -> CliResult {
    let dir = tempfile::Builder::new().prefix("rethread-demo").tempdir()?;
    let store_path = dir.path().join("rethread.redb");
    let home = dir.path().join("codex-home");
    let home_text = home.display().to_string();
    let store: Arc<dyn BindingStore> =
        Arc::new(RedbStore::open(&store_path, OpenOptions::default()).await?);
    println!(
        "rethread demo: an embedded redb store at {}",
        store_path.display()
    );
    println!("and the bundled fake codex app-server with CODEX_HOME={home_text}");

    step("1. First turn: a new codex thread, bound once the turn's rows are durable");
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(&home)
        .spawn_in_process()?;
    let (outcome, _, notices) = turn(
        &store,
        stream,
        &home_text,
        "My favourite fruit is papaya. Remember it.",
    )
    .await?;
    let first = outcome.thread_id().to_string();
    check(
        matches!(outcome, OpenOutcome::Started { .. }),
        &format!("started thread {first}"),
    )?;
    check(notices.is_empty(), "no notice")?;
    let record = store.require_session(SESSION).await?;
    check(
        record.thread_id() == Some(first.as_str()) && record.row_count == 2,
        "binding and 2 transcript rows stored together",
    )?;

    step("2. The app-server restarts; a rebuilt binder resumes the bound thread");
    let stream = fake.restart().await?;
    let (outcome, _, notices) = turn(&store, stream, &home_text, "Which fruit did I name?").await?;
    check(
        outcome
            == OpenOutcome::Resumed {
                thread_id: first.clone(),
            },
        "thread/resume, then turn/start: no new thread",
    )?;
    check(notices.is_empty(), "no notice when the resume succeeds")?;
    check(
        model_saw(&fake, "papaya"),
        "the model's request holds turn 1: it remembers",
    )?;

    step("3. The rollout is lost; the next agent fails closed");
    fake.corrupt_rollout(&first, Corruption::Delete)?;
    println!("   (deleted the rollout of {first})");
    let stream = fake.restart().await?;
    let (outcome, _, notices) =
        turn(&store, stream, &home_text, "Do you still know my fruit?").await?;
    let OpenOutcome::FellBack {
        thread_id: second,
        reason,
        seeded,
        ..
    } = &outcome
    else {
        return Err(format!("demo check failed: expected a fallback, got {outcome:?}").into());
    };
    check(notices.len() == 1, "exactly one notice")?;
    check(
        *seeded && model_saw(&fake, "papaya"),
        "the fresh thread was seeded from the transcript",
    )?;
    let record = store.require_session(SESSION).await?;
    check(
        record.thread_id() == Some(second.as_str()) && record.is_retired(&first),
        &format!("binding moved {first} -> {second} ({reason}); the lost thread is retired"),
    )?;
    check(record.row_count == 6, "all 6 transcript rows kept")?;
    fake.kill().await;
    println!();
    println!("done: the conversation survived a restart, and a lost thread failed closed with one notice.");
    Ok(())
}
