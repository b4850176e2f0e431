//! The two outgoing queues (to codex, to the client) and the writer that drains each.
//!
//! A queue is bounded in lines (the channel) and in bytes (a semaphore whose permits a line
//! holds until written; a line larger than the budget takes all of it). A sender waits at
//! either bound: a slow reader on one side slows the other side down instead of growing memory.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// What a queue carries.
#[derive(Debug)]
enum Item {
    Line(Bytes, OwnedSemaphorePermit),
    /// Flush, then say that everything queued before is written.
    Flushed(oneshot::Sender<()>),
    /// Flush and close the writer (end of input for codex, end of output for the client).
    Close,
}

/// The writer has gone (its reader closed the pipe, or the queue is closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueClosed;

/// A sender into one queue. Clones share the queue.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    tx: mpsc::Sender<Item>,
    budget: Arc<Semaphore>,
    budget_bytes: u32,
}

/// The receiving end, drained by [`drain`].
#[derive(Debug)]
pub(crate) struct QueueReceiver {
    rx: mpsc::Receiver<Item>,
    budget: Arc<Semaphore>,
}

/// A queue of at most `lines` lines and `bytes` bytes (each at least 1).
pub(crate) fn queue(lines: usize, bytes: usize) -> (Queue, QueueReceiver) {
    let (tx, rx) = mpsc::channel(lines.max(1));
    let budget_bytes = u32::try_from(bytes.max(1)).unwrap_or(u32::MAX);
    let budget = Arc::new(Semaphore::new(budget_bytes as usize));
    (
        Queue {
            tx,
            budget: budget.clone(),
            budget_bytes,
        },
        QueueReceiver { rx, budget },
    )
}

impl Queue {
    /// Enqueues one line, waiting while the queue is full.
    pub(crate) async fn send(&self, bytes: Bytes) -> Result<(), QueueClosed> {
        let cost = u32::try_from(bytes.len())
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_bytes);
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| QueueClosed)?;
        self.tx
            .send(Item::Line(bytes, permit))
            .await
            .map_err(|_| QueueClosed)
    }

    /// Resolves once every line queued before this call is written and flushed.
    pub(crate) async fn flushed(&self) -> Result<oneshot::Receiver<()>, QueueClosed> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Item::Flushed(tx))
            .await
            .map_err(|_| QueueClosed)?;
        Ok(rx)
    }

    /// Asks the writer to flush and close once everything queued before is written.
    pub(crate) async fn close(&self) {
        let _ = self.tx.send(Item::Close).await;
    }
}

/// Writes what the queue carries until it is closed (a [`Queue::close`], or every sender
/// dropped), flushing whenever it runs empty; then closes the queue, so senders learn the
/// writer is gone.
pub(crate) async fn drain<W: AsyncWrite + Unpin>(
    receiver: QueueReceiver,
    writer: W,
    buffer: usize,
) -> io::Result<()> {
    let QueueReceiver { mut rx, budget } = receiver;
    let mut writer = BufWriter::with_capacity(buffer, writer);
    let result = async {
        while let Some(item) = rx.recv().await {
            let mut item = Some(item);
            // Write everything already waiting, then flush once.
            while let Some(current) = item.take() {
                match current {
                    Item::Line(bytes, permit) => {
                        writer.write_all(&bytes).await?;
                        drop(permit);
                    }
                    Item::Flushed(done) => {
                        writer.flush().await?;
                        let _ = done.send(());
                    }
                    Item::Close => {
                        writer.flush().await?;
                        return writer.shutdown().await;
                    }
                }
                item = rx.try_recv().ok();
            }
            writer.flush().await?;
        }
        writer.flush().await?;
        writer.shutdown().await
    }
    .await;
    // Senders waiting for room learn at once that nobody will write their line.
    rx.close();
    budget.close();
    result
}
