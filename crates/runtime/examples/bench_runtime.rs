//! `cargo xtask bench runtime`: what rethread adds before a turn, and what resuming costs.
//!
//! 1. In-process fake: time from `SessionBinder::open` to `turn/start` sent, for a resumed and a
//!    fresh conversation (the store is redb on disk, as in production).
//! 2. The real current codex (offline, Responses stand-in): `thread/resume` latency of a thread
//!    with 1, 100 and 1000 earlier turns, with and without `excludeTurns`, each in a freshly
//!    started app-server (a restart is when resume matters).
//!
//! Flags: `--iterations N` (part 1, default 300), `--turns 1,100,1000`, `--samples N` (part 2,
//! default 5), `--skip-real`.

use std::time::{Duration, Instant};

use rethread_fake_appserver::FakeAppServer;
use rethread_protocol::messages::{
    ThreadResume, ThreadResumeParams, ThreadStart, ThreadStartParams, TurnStart, TurnStartParams,
    UserInput,
};
use rethread_runtime::{AppServerClient, BinderOptions, CodexCommand, SessionBinder, StatusRail};
use rethread_store::{BindingStore, OpenOptions, TurnCommit};
use rethread_testkit::real::{codex_or_skip, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;

struct Args {
    iterations: usize,
    turns: Vec<usize>,
    samples: usize,
    skip_real: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        iterations: 300,
        turns: vec![1, 100, 1000],
        samples: 5,
        skip_real: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--iterations" => {
                args.iterations = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--iterations N")
            }
            "--samples" => {
                args.samples = it.next().and_then(|v| v.parse().ok()).expect("--samples N")
            }
            "--turns" => {
                args.turns = it
                    .next()
                    .expect("--turns a,b,c")
                    .split(',')
                    .map(|t| t.parse().expect("a number of turns"))
                    .collect()
            }
            "--skip-real" => args.skip_real = true,
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    format!(
        "{:>9.3} | {:>9.3}",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3
    )
}

async fn connect(stream: tokio::io::DuplexStream) -> AppServerClient {
    let (reader, writer) = tokio::io::split(stream);
    AppServerClient::builder()
        .rail(StatusRail::recording().0)
        .connect(reader, writer)
        .await
        .unwrap()
}

/// Part 1: `open` (resume or start) then `turn/start` sent, on the in-process fake.
async fn open_to_turn_start(iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store: BindingStore =
        BindingStore::redb(dir.path().join("bench.redb"), OpenOptions::default())
            .await
            .unwrap();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(dir.path().join("home"))
        .spawn_in_process()
        .unwrap();
    let client = connect(stream).await;
    // One bound session with a materialized thread to resume.
    let thread = client
        .request::<ThreadStart>(&ThreadStartParams::default())
        .await
        .unwrap()
        .thread
        .id;
    let mut events = client.subscribe(&thread).unwrap();
    client
        .request::<TurnStart>(&TurnStartParams::new(
            thread.clone(),
            vec![UserInput::text("hello")],
        ))
        .await
        .unwrap();
    while !matches!(
        events.next().await.unwrap(),
        rethread_runtime::ThreadEvent::Notification(
            rethread_protocol::messages::ServerNotification::TurnCompleted(_)
        )
    ) {}
    drop(events);
    let commit = TurnCommit::new("bound", thread.clone(), vec![]);
    store.commit_turn(commit).await.unwrap();

    let options = BinderOptions::default().seed(None);
    let mut resumed = Vec::with_capacity(iterations);
    let mut fresh = Vec::with_capacity(iterations);
    for i in 0..iterations {
        // A restart forgets loaded threads, so every resume does the real work.
        let client = connect(fake.restart().await.unwrap()).await;
        let started = Instant::now();
        let mut agent = SessionBinder::new("bound", store.clone(), StatusRail::recording().0)
            .with_options(options.clone());
        let session = agent.open(&client).await.unwrap();
        assert_eq!(session.outcome().as_str(), "resumed");
        let turn =
            TurnStartParams::new(session.thread_id().to_string(), vec![UserInput::text("x")]);
        let request = client.request::<TurnStart>(&turn);
        // Sent as soon as the request future is first polled; the response is not awaited in
        // the figure, only the send.
        tokio::pin!(request);
        let _ = futures::poll!(&mut request);
        resumed.push(started.elapsed());

        let started = Instant::now();
        let mut agent = SessionBinder::new(
            format!("fresh-{i}"),
            store.clone(),
            StatusRail::recording().0,
        )
        .with_options(options.clone());
        let session = agent.open(&client).await.unwrap();
        assert_eq!(session.outcome().as_str(), "started");
        let turn =
            TurnStartParams::new(session.thread_id().to_string(), vec![UserInput::text("x")]);
        let request = client.request::<TurnStart>(&turn);
        tokio::pin!(request);
        let _ = futures::poll!(&mut request);
        fresh.push(started.elapsed());
    }
    println!("## open -> turn/start sent (in-process fake, redb store, {iterations} iterations)\n");
    println!("| conversation | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    println!("| resumed | {} |", summary(resumed));
    println!("| fresh | {} |", summary(fresh));
    fake.kill().await;
}

/// Part 2: resume latency on the real codex by history length.
async fn real_resume(turns: &[usize], samples: usize) {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let spawn = || {
        let command = CodexCommand::new(&codex)
            .env("CODEX_HOME", home.path().display().to_string())
            .env("RUST_LOG", "error");
        async move {
            AppServerClient::builder()
                .rail(StatusRail::recording().0)
                .spawn(&command)
                .await
                .unwrap()
        }
    };
    println!("\n## thread/resume on real codex {CURRENT} (fresh app-server per sample, {samples} samples)\n");
    println!("| earlier turns | excludeTurns | p50 ms | max ms |");
    println!("|---:|---|---:|---:|");
    let mut thread: Option<String> = None;
    let mut done = 0;
    for &target in turns {
        // Grow the history in a builder process, then stop it: 0.169.0 allows one writer.
        let builder = spawn().await;
        let id = match &thread {
            Some(id) => {
                builder
                    .request::<ThreadResume>(
                        &ThreadResumeParams::new(id.clone()).exclude_turns(true),
                    )
                    .await
                    .unwrap();
                id.clone()
            }
            None => {
                builder
                    .request::<ThreadStart>(&ThreadStartParams::default())
                    .await
                    .unwrap()
                    .thread
                    .id
            }
        };
        thread = Some(id.clone());
        let mut events = builder.subscribe(&id).unwrap();
        while done < target {
            let turn =
                TurnStartParams::new(id.clone(), vec![UserInput::text(format!("turn {done}"))]);
            builder.request::<TurnStart>(&turn).await.unwrap();
            while !matches!(
                events.next().await.unwrap(),
                rethread_runtime::ThreadEvent::Notification(
                    rethread_protocol::messages::ServerNotification::TurnCompleted(_)
                )
            ) {}
            done += 1;
        }
        drop(events);
        builder.shutdown().await;
        for exclude in [true, false] {
            let mut times = Vec::new();
            for _ in 0..samples {
                let fresh = spawn().await;
                let params = ThreadResumeParams::new(id.clone()).exclude_turns(exclude);
                let started = Instant::now();
                let result = fresh.request::<ThreadResume>(&params).await;
                let elapsed = started.elapsed();
                fresh.shutdown().await;
                result.unwrap();
                times.push(elapsed);
            }
            times.sort();
            println!(
                "| {target} | {exclude} | {:.1} | {:.1} |",
                percentile(&times, 0.5).as_secs_f64() * 1e3,
                times.last().unwrap().as_secs_f64() * 1e3
            );
        }
    }
}

fn main() {
    let args = parse_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        open_to_turn_start(args.iterations).await;
        if !args.skip_real {
            real_resume(&args.turns, args.samples).await;
        }
    });
}
