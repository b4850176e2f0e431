//! `rethread demo`: the whole story on an embedded SQLite store (the default) and the bundled
//! fake app-server, narrated. Every claim it narrates is checked; a failed check fails the
//! demo. With `--json` the story is one object on stdout, also when a check fails.

use std::io::stdout;

use anstyle::{AnsiColor, Style};
use rethread_fake_appserver::faults::Corruption;
use rethread_fake_appserver::{FakeAppServer, FakeHandle};
use rethread_runtime::{
    AppServerClient, BinderOptions, OpenOutcome, SessionBinder, StatusKind, StatusRail,
};
use rethread_store::{BindingStore, OpenOptions};
use serde_json::{json, Value};
use tokio::io::DuplexStream;

use crate::output::{self, outln};
use crate::CliResult;

const SESSION: &str = "demo-session";

/// The story as it is told: printed line by line, or kept for one JSON object (`--json`).
struct Narration {
    json: bool,
    steps: Vec<Value>,
}

impl Narration {
    fn current(&mut self, field: &str) -> &mut Vec<Value> {
        let step = self.steps.last_mut().expect("a step is always open");
        step[field].as_array_mut().expect("an array field")
    }

    fn step(&mut self, title: &str) {
        if self.json {
            let step = json!({"title": title, "lines": [], "checks": []});
            self.steps.push(step);
        } else {
            let title = format!("== {title}");
            outln!(
                "\n{}",
                output::paint(&stdout(), Style::new().bold(), &title)
            );
        }
    }

    /// One line of narration (in `style` on a terminal).
    fn say(&mut self, line: &str, style: Style) {
        if self.json {
            self.current("lines").push(json!(line));
        } else {
            outln!("{}", output::paint(&stdout(), style, line));
        }
    }

    fn check(&mut self, ok: bool, what: &str) -> CliResult {
        if !ok {
            return Err(format!("demo check failed: {what}").into());
        }
        if self.json {
            self.current("checks").push(json!(what));
        } else {
            outln!("   ok: {what}");
        }
        Ok(())
    }

    /// Under `--json`, prints the one object, with the failure if the story failed.
    fn finish(self, result: &CliResult) {
        if !self.json {
            return;
        }
        let mut object = json!({"ok": result.is_ok(), "steps": self.steps});
        if let Err(error) = result {
            object["error"] = json!(error.to_string());
        }
        outln!("{object}");
    }
}

/// What the story runs on: the store, the fake codex, and the fake's `CODEX_HOME`.
struct World {
    store: BindingStore,
    fake: FakeHandle,
    home: String,
}

impl World {
    /// One "process": a fresh client on the fake (`stream`) and a fresh binder (with the
    /// rollout mirror on or off), one turn.
    async fn turn(
        &self,
        story: &mut Narration,
        stream: DuplexStream,
        mirror: bool,
        message: &str,
    ) -> CliResult<(OpenOutcome, Vec<String>)> {
        let (rail, recorded) = StatusRail::recording();
        let (reader, writer) = tokio::io::split(stream);
        let client = AppServerClient::builder()
            .rail(rail.clone())
            .connect(reader, writer)
            .await?;
        let home = Some(self.home.clone());
        let options = BinderOptions::default().codex_home(home).mirror(mirror);
        let mut binder =
            SessionBinder::new(SESSION, self.store.clone(), rail).with_options(options);
        let mut session = binder.open(&client).await?;
        story.say(&format!("   user: {message}"), Style::new());
        let report = session.run_turn(message).await?;
        story.say(&format!("   codex: {}", report.reply), Style::new());
        let notices = recorded.messages(StatusKind::Lifecycle);
        for notice in &notices {
            // Narration goes to stdout in order with the rest of the story.
            let yellow = AnsiColor::Yellow.on_default();
            story.say(&format!("   notice: {notice}"), yellow);
        }
        let outcome = session.outcome().clone();
        drop(session);
        // This "process" ends: the next one takes the session's lease at once.
        binder.close().await?;
        Ok((outcome, notices))
    }

    /// A turn after a restart that must resume `thread`: the same thread, no notice, and the
    /// model's request holds turn 1 (`says`: the three checks' lines).
    async fn resumed_turn(
        &self,
        story: &mut Narration,
        thread: &str,
        message: &str,
        [same_thread, no_notice, remembers]: [&str; 3],
    ) -> CliResult {
        let stream = self.fake.restart().await?;
        let (outcome, notices) = self.turn(story, stream, true, message).await?;
        let resumed = matches!(&outcome, OpenOutcome::Resumed { thread_id } if thread_id == thread);
        story.check(resumed, same_thread)?;
        story.check(notices.is_empty(), no_notice)?;
        story.check(self.model_saw("papaya"), remembers)
    }

    fn model_saw(&self, word: &str) -> bool {
        let requests = self.fake.model_requests();
        requests.last().is_some_and(|request| request.saw(word))
    }
}

/// Plays the story; with `json`, prints it as one object at the end.
pub(crate) async fn run(json: bool) -> CliResult {
    let steps = vec![json!({"title": "setup", "lines": [], "checks": []})];
    let mut story = Narration { json, steps };
    let result = play(&mut story).await;
    story.finish(&result);
    result
}

async fn play(story: &mut Narration) -> CliResult {
    let dir = tempfile::Builder::new().prefix("rethread-demo").tempdir()?;
    let store_path = dir.path().join("rethread.sqlite");
    let home = dir.path().join("codex-home");
    let store = BindingStore::sqlite(&store_path, OpenOptions::default()).await?;
    let path = store_path.display();
    let setup = format!("rethread demo: an embedded SQLite store (the default) at {path}");
    story.say(&setup, Style::new());
    let home_text = home.display().to_string();
    let setup = format!("and the bundled fake codex app-server with CODEX_HOME={home_text}");
    story.say(&setup, Style::new());

    story.step("1. First turn: a new codex thread, bound once the turn's rows are durable");
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(&home)
        .spawn_in_process()?;
    let world = World {
        store,
        fake,
        home: home_text,
    };
    let fruit = "My favourite fruit is papaya. Remember it.";
    let (outcome, notices) = world.turn(story, stream, true, fruit).await?;
    let first = outcome.thread_id().to_string();
    let started = matches!(outcome, OpenOutcome::Started { .. });
    story.check(started, &format!("started thread {first}"))?;
    story.check(notices.is_empty(), "no notice")?;
    let record = world.store.require_session(SESSION).await?;
    story.check(
        record.thread_id() == Some(first.as_str()) && record.row_count == 2,
        "binding and 2 transcript rows stored together",
    )?;

    story.step("2. The app-server restarts; a rebuilt binder resumes the bound thread");
    let checks = [
        "thread/resume, then turn/start: no new thread",
        "no notice when the resume succeeds",
        "the model's request holds turn 1: it remembers",
    ];
    let question = "Which fruit did I name?";
    world.resumed_turn(story, &first, question, checks).await?;

    story.step("3. The rollout is lost; the store's mirror of it restores the same thread");
    world.fake.corrupt_rollout(&first, Corruption::Delete)?;
    let lost = "as a pruned ~/.codex or a new container would";
    story.say(
        &format!("   (deleted the rollout of {first}, {lost})"),
        Style::new(),
    );
    let checks = [
        "restored from the store, then thread/resume: the same thread",
        "no notice",
        "the model's request holds turn 1 again",
    ];
    let question = "Do you still know my fruit?";
    world.resumed_turn(story, &first, question, checks).await?;

    story.step("4. Lost again, with the mirror off (RETHREAD_MIRROR=off): it fails closed");
    world.fake.corrupt_rollout(&first, Corruption::Delete)?;
    story.say(
        &format!("   (deleted the rollout of {first})"),
        Style::new(),
    );
    let stream = world.fake.restart().await?;
    let question = "Do you still know my fruit now?";
    let (outcome, notices) = world.turn(story, stream, false, question).await?;
    let OpenOutcome::FellBack {
        thread_id: second,
        reason,
        seeded,
        ..
    } = &outcome
    else {
        return Err(format!("demo check failed: expected a fallback, got {outcome:?}").into());
    };
    story.check(notices.len() == 1, "exactly one notice")?;
    story.check(
        *seeded && world.model_saw("papaya"),
        "the fresh thread was seeded from the transcript",
    )?;
    let record = world.store.require_session(SESSION).await?;
    story.check(
        record.thread_id() == Some(second.as_str()) && record.is_retired(&first),
        &format!("binding moved {first} -> {second} ({reason}); the lost thread is retired"),
    )?;
    story.check(record.row_count == 8, "all 8 transcript rows kept")?;
    world.fake.kill().await;
    if !story.json {
        outln!("");
    }
    let done = "done: the conversation survived a restart and a lost rollout, and a lost \
                thread failed closed with one notice.";
    story.say(done, Style::new());
    Ok(())
}
