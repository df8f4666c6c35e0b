//! Unit tests of the worker (`src/server/worker.rs`).

use super::*;
use crate::runtime::fake::FakeBackend;
use crate::server::outbox::EventRx;
use tokio::sync::mpsc::error::TryRecvError;

/// Counts up from the last prompt id through the fixture tokenizer's digits ('0'..'9' are
/// ids 15..24), one forward per `delay`.
fn slow(delay: Duration) -> FakeBackend {
    FakeBackend::new(384, |h| 15 + (h[h.len() - 1] as u32 + 1 - 15) % 10)
        .peak(5.0)
        .delay(delay)
}

/// Panics in its first decoder step.
fn panics() -> FakeBackend {
    FakeBackend::new(2, |_| 1).peak(1.0).panic_at_decode(1)
}

/// Runs `backend` on a worker thread over `shared`, with the fixture's tokenizer.
fn spawn<B: Backend + Send + 'static>(
    backend: B,
    batch: usize,
    shared: &Arc<Shared>,
) -> std::thread::JoinHandle<()> {
    spawn_engine(backend, batch, shared, 0)
}

/// Like `spawn`, as engine `me` of `shared`.
fn spawn_engine<B: Backend + Send + 'static>(
    backend: B,
    batch: usize,
    shared: &Arc<Shared>,
    me: usize,
) -> std::thread::JoinHandle<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-lightonocr/checkpoint");
    let prompter = Arc::new(Prompter::from_model_dir(&dir, 326).unwrap());
    let s = shared.clone();
    std::thread::spawn(move || {
        let engine = Engine::new(backend, batch, 326);
        run_worker(engine, prompter, s, me);
    })
}

fn start(delay_ms: u64, batch: usize, queue: usize) -> Arc<Shared> {
    let shared = Arc::new(Shared::new(queue));
    let delay = Duration::from_millis(delay_ms);
    spawn(slow(delay), batch, &shared);
    shared
}

fn job(max: usize, stop: &[&str], timeout: Duration) -> (Job, EventRx) {
    let (tx, rx) = crate::server::outbox::channel(crate::server::outbox::MAX_UNREAD_BYTES);
    let now = Instant::now();
    (
        Job {
            id: "test".into(),
            req: GenRequest::text(vec![15], max),
            stop: stop.iter().map(|s| s.to_string()).collect(),
            accepted: now,
            deadline: now + timeout,
            events: tx,
        },
        rx,
    )
}

/// Waits for the next event (blocking, with a bound).
fn next(rx: &mut EventRx) -> JobEvent {
    let t = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(e) => return e,
            Err(TryRecvError::Empty) if t.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("no event: {e:?}"),
        }
    }
}

fn text_of(rx: &mut EventRx) -> (String, JobEvent) {
    let mut text = String::new();
    loop {
        match next(rx) {
            JobEvent::Delta { text: t, .. } => text.push_str(&t),
            other => return (text, other),
        }
    }
}

/// Waits (bounded) until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn jobs_go_to_the_engine_with_the_fewest_tokens_in_hand() {
    let shared = Arc::new(Shared::with_engines(
        8,
        vec!["cpu:0".into(), "cpu:1".into()],
    ));
    for me in 0..2 {
        spawn_engine(slow(Duration::from_millis(2)), 2, &shared, me);
    }
    eventually("both engines ready", || {
        shared
            .engines
            .iter()
            .all(|e| e.state() == ModelState::Ready)
    });
    // One long job: whichever engine takes it holds ~100k tokens from then on.
    let (big, _keep) = job(100_000, &[], Duration::from_secs(600));
    shared.submit(big).unwrap();
    let admitted = |i: usize| shared.engines[i].admitted.load(Ordering::Relaxed);
    eventually("the long job admitted", || admitted(0) + admitted(1) == 1);
    let busy = if admitted(0) == 1 { 0 } else { 1 };
    assert!(shared.engines[busy].load_tokens.load(Ordering::Relaxed) > 90_000);
    // Short jobs, one at a time: both engines have room, so each goes to the idle one.
    for _ in 0..5 {
        let (j, mut rx) = job(3, &[], Duration::from_secs(30));
        shared.submit(j).unwrap();
        let (text, done) = text_of(&mut rx);
        assert_eq!(text, "123");
        assert!(matches!(done, JobEvent::Done { .. }));
    }
    assert_eq!(admitted(busy), 1);
    assert_eq!(admitted(1 - busy), 5);
    // Finished work leaves the load: the idle engine holds nothing now.
    eventually("the short jobs released", || {
        shared.engines[1 - busy].load_tokens.load(Ordering::Relaxed) == 0
    });
    // Two more long jobs: the first to the idle engine (0 tokens in hand), the second
    // back to the busy one, which has worked part of its ~100k tokens off by now.
    let mut keep = Vec::new();
    for want in [(1 - busy, 6), (busy, 2)] {
        let (j, rx) = job(100_000, &[], Duration::from_secs(600));
        keep.push(rx);
        shared.submit(j).unwrap();
        eventually("the long job admitted", || admitted(want.0) == want.1);
    }
    // The busy engine's batch is full now: a short job goes to the other, whatever it holds.
    let (j, mut rx) = job(3, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    assert_eq!(text_of(&mut rx).0, "123");
    assert_eq!((admitted(busy), admitted(1 - busy)), (2, 7));
}

/// An engine leaves a job to a less loaded one with room; when that one's room goes,
/// the waiting engine is woken and takes the job (no timed re-check to wait for).
#[test]
fn a_room_change_wakes_the_engine_that_deferred() {
    let shared = Arc::new(Shared::with_engines(8, vec!["a".into(), "b".into()]));
    shared.set_ready(0);
    shared.set_ready(1);
    shared.set_room(0, true);
    shared.set_room(1, true);
    shared.engines[1].load_tokens.store(500, Ordering::Relaxed);
    let (j, _rx) = job(3, &[], Duration::from_secs(600));
    shared.submit(j).unwrap();
    // Engine 1 holds more tokens than engine 0, which has room: it defers.
    assert!(shared.next_job(1, false, Duration::ZERO).is_none());
    let s = shared.clone();
    let waiting = std::thread::spawn(move || {
        let t = Instant::now();
        let job = s.next_job(1, true, Duration::from_secs(60));
        (job.is_some(), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    shared.set_room(0, false);
    let (took, waited) = waiting.join().unwrap();
    assert!(took);
    // Woken by the change, not by the end of its 60 s wait.
    assert!(waited < Duration::from_secs(30), "{waited:?}");
}

#[test]
fn the_server_is_ready_while_one_engine_is_and_fails_when_none_is() {
    let shared = Shared::with_engines(4, vec!["gpu:0".into(), "cpu:0".into()]);
    assert_eq!(shared.state(), ModelState::Loading);
    shared.set_failed(0, "no such device".into());
    assert_eq!(shared.state(), ModelState::Loading);
    let (j, mut rx) = job(3, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    shared.set_ready(1);
    assert_eq!(shared.state(), ModelState::Ready);
    assert_eq!(shared.failures().unwrap(), "gpu:0: no such device");
    // The last engine going too fails what still waits, naming why.
    shared.set_failed(1, "the engine thread stopped".into());
    assert_eq!(shared.state(), ModelState::Failed);
    match next(&mut rx) {
        JobEvent::Failed(e) => assert!(e.to_string().contains("stopped"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(shared.queue_depth(), 0);
}

#[test]
fn text_streams_and_stop_strings_span_tokens() {
    let shared = start(0, 2, 4);
    let (j, mut rx) = job(12, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    let (text, done) = text_of(&mut rx);
    assert_eq!(text, "123456789012");
    assert!(
        matches!(
            done,
            JobEvent::Done {
                finish_reason: "length",
                completion_tokens: 12,
                ..
            }
        ),
        "{done:?}"
    );
    // "67" spans two tokens; nothing of it is sent.
    let (j, mut rx) = job(12, &["67", "9"], Duration::from_secs(30));
    shared.submit(j).unwrap();
    let (text, done) = text_of(&mut rx);
    assert_eq!(text, "12345");
    match done {
        JobEvent::Done {
            finish_reason,
            stop_reason,
            completion_tokens,
        } => {
            assert_eq!(
                (finish_reason, stop_reason.as_deref(), completion_tokens),
                ("stop", Some("67"), 7)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn deadline_fails_the_request_and_frees_the_slot() {
    let shared = start(5, 1, 4);
    let (j, mut rx) = job(10_000, &[], Duration::from_millis(60));
    shared.submit(j).unwrap();
    let (_, end) = text_of(&mut rx);
    assert!(
        matches!(end, JobEvent::Failed(ApiError::Timeout { .. })),
        "{end:?}"
    );
    let (j, mut rx) = job(3, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    assert_eq!(text_of(&mut rx).0, "123");
}

#[test]
fn a_client_that_goes_away_frees_its_slot_at_the_next_step() {
    let shared = start(5, 1, 4);
    let (j, mut rx) = job(100_000, &[], Duration::from_secs(600));
    shared.submit(j).unwrap();
    assert!(matches!(next(&mut rx), JobEvent::Delta { .. }));
    // The only batch slot is taken; a second job waits in the queue.
    let (j2, mut rx2) = job(2, &[], Duration::from_secs(30));
    shared.submit(j2).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(matches!(rx2.try_recv(), Err(TryRecvError::Empty)));
    drop(rx);
    assert_eq!(text_of(&mut rx2).0, "12");
}

#[test]
fn a_dying_engine_thread_fails_its_requests_and_health() {
    let shared = Arc::new(Shared::new(4));
    let (j, mut rx) = job(5, &[], Duration::from_secs(30));
    let (j2, mut rx2) = job(5, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    shared.submit(j2).unwrap();
    let t = spawn(panics(), 1, &shared);
    assert!(t.join().is_err(), "the worker panicked");
    assert_eq!(shared.state(), ModelState::Failed);
    assert!(shared.failures().unwrap().contains("stopped"));
    // Both clients hear the end of their channel instead of waiting forever.
    for rx in [&mut rx, &mut rx2] {
        loop {
            match rx.try_recv() {
                Ok(_) => continue,
                Err(e) => {
                    assert_eq!(e, TryRecvError::Disconnected);
                    break;
                }
            }
        }
    }
}

/// Issue 10.1: after the engine thread dies the process must exit non-zero;
/// `supervise` reports the death (serve exits in `on_death`).
#[test]
fn a_dead_engine_is_reported_so_that_serve_exits() {
    let shared = Arc::new(Shared::new(4));
    let (j, mut rx) = job(5, &[], Duration::from_secs(30));
    shared.submit(j).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-lightonocr/checkpoint");
    let prompter = Arc::new(Prompter::from_model_dir(&dir, 326).unwrap());
    let engine = Engine::new(panics(), 1, 326);
    let mut died = None;
    let s2 = shared.clone();
    supervise(
        &shared,
        0,
        || run_worker(engine, prompter, s2, 0),
        |why| died = Some(why),
    );
    let why = died.expect("on_death was called");
    assert!(
        why.contains("panicked") && why.contains("a bug in a runtime"),
        "{why}"
    );
    assert_eq!(shared.state(), ModelState::Failed);
    // The client hears the end of its channel instead of waiting for ever.
    while rx.try_recv().is_ok() {}
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Disconnected);
    // A loop that merely returns is a death too.
    let mut died = None;
    supervise(&shared, 0, || {}, |why| died = Some(why));
    assert!(died.unwrap().contains("returned"));
}

#[test]
fn a_full_queue_refuses_and_pruned_clients_free_queue_slots() {
    let shared = start(20, 1, 1);
    let (running, _keep) = job(100_000, &[], Duration::from_secs(600));
    shared.submit(running).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (waiting, rx_wait) = job(1, &[], Duration::from_secs(600));
    shared.submit(waiting).unwrap();
    let (refused, _r) = job(1, &[], Duration::from_secs(600));
    assert!(matches!(
        shared.submit(refused),
        Err(ApiError::QueueFull { queued: 1 })
    ));
    drop(rx_wait);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(shared.queue_depth(), 0, "the abandoned job was pruned");
    let (again, _r2) = job(1, &[], Duration::from_secs(600));
    shared.submit(again).unwrap();
}
