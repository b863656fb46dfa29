//! The server side of the framed link (`crate::proto::link`): a relay listener's TLS connection
//! whose client chose `blindrelay/1` is served here instead of by HTTP.
//!
//! Each frame takes the pipeline's way in, as a `POST /v2/relay` body does
//! (`crate::pipeline::ingress`: the cheap budget once its head is read, the length in the head,
//! the frame read within its deadline, framing and admission), then the pipeline in its own
//! task. A refusal before the frame's bytes are read closes the link once it is written, as it
//! closes an HTTP connection: no further frame is read. A refusal of a frame read (admission's,
//! the pipeline's) is an answer like any other, and the link, which may carry other frames in
//! flight, stays open.
//!
//! Bounds: at most [`LINK_IN_FLIGHT`] frames of one link in flight (past it the next head is not
//! read until one is answered: the client's TCP window fills); the listener's header timeout is
//! the idle timeout (no head while nothing is in flight: closed, counted as timed out) and the
//! longest a write of answers may wait for the client to read; a frame's bytes within its body
//! deadline; from the stop on no frame is read and the link closes once the frames in flight
//! are answered (the listener drops it after its grace). Answers are written by one task that
//! takes every answer ready and writes them in one go.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use listener::Closed;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{ApiError, process_admitted};
use crate::pipeline::ingress::{BodyError, Refused};
use crate::pipeline::{Admitted, Pipeline};
use crate::proto::NodeId;
use crate::proto::answer::{ANSWER_LEN, pad};
use crate::proto::link::{ANSWER_HEAD, AnswerHead, REQUEST_HEAD, RequestHead};
use crate::reason::Reason;

/// Frames of one link in flight at most.
pub(crate) const LINK_IN_FLIGHT: usize = 64;

/// An answer to write, its head and body together.
type Encoded = Vec<u8>;

/// Serves the framed link `stream` from `peer`, whose client authenticated as `link`, for
/// `pipeline`, until the client closes it, it breaks, it idles for `idle` or `stop`.
pub(crate) async fn serve<S>(
    pipeline: Arc<Pipeline>,
    stream: S,
    peer: SocketAddr,
    link: Option<NodeId>,
    idle: Duration,
    stop: &CancellationToken,
) -> Closed
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel::<Encoded>(LINK_IN_FLIGHT);
    let reader = Reader {
        pipeline,
        peer,
        link,
        idle,
        permits: Arc::new(Semaphore::new(LINK_IN_FLIGHT)),
        tx,
    };
    // The reader's end drops its sender; the writer ends once every frame in flight is
    // answered (each holds a sender) and its answers are written.
    let (closed, ()) = tokio::join!(reader.run(&mut rd, stop), write_answers(wr, rx, idle));
    closed
}

/// What reads a link's frames and starts their work.
struct Reader {
    pipeline: Arc<Pipeline>,
    peer: SocketAddr,
    link: Option<NodeId>,
    idle: Duration,
    permits: Arc<Semaphore>,
    tx: mpsc::Sender<Encoded>,
}

impl Reader {
    async fn run<R: AsyncRead + Unpin>(self, rd: &mut R, stop: &CancellationToken) -> Closed {
        loop {
            // A place for the next frame first: a link with its most frames in flight is not
            // read until one is answered.
            let permit = tokio::select! {
                p = Arc::clone(&self.permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return Closed::Done,
                },
                () = stop.cancelled() => return Closed::Done,
            };
            let head = match self.next_head(rd, stop).await {
                Ok(Some(head)) => head,
                Ok(None) => return Closed::Done,
                Err(closed) => return closed,
            };
            if let Err(closed) = self.frame(rd, head, permit).await {
                return closed;
            }
        }
    }

    /// The next request head; `None` when the client closed the link (or the stop came)
    /// between two frames.
    async fn next_head<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        stop: &CancellationToken,
    ) -> Result<Option<RequestHead>, Closed> {
        let read = read_head(rd);
        tokio::pin!(read);
        loop {
            tokio::select! {
                r = &mut read => return match r {
                    Ok(head) => Ok(head.map(|h| RequestHead::decode(&h))),
                    Err(e) => Err(Closed::Own(e)),
                },
                // Idle: nothing read for `idle` with nothing in flight (frames in flight keep
                // the link open; their answers are on their way).
                () = tokio::time::sleep(self.idle) => {
                    if self.permits.available_permits() + 1 >= LINK_IN_FLIGHT {
                        return Err(Closed::HeaderTimeout);
                    }
                }
                () = stop.cancelled() => return Ok(None),
            }
        }
    }

    /// One frame whose `head` was read, taken in (refused before its bytes are read: the link
    /// closed after the answer), then handed to its own task.
    async fn frame<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        head: RequestHead,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), Closed> {
        let len = head.len;
        // Allocated only once the head's length passed the check (the future runs then).
        let body = async move {
            let mut body = vec![0u8; len];
            rd.read_exact(&mut body).await.map_err(BodyError::Broken)?;
            Ok(body)
        };
        let pipeline = &self.pipeline;
        let admitted = match pipeline
            .take_in(self.peer.ip(), self.link, Some(len as u64), body)
            .await
        {
            Ok(admitted) => Ok(admitted),
            Err(Refused::Unread(r)) => return self.last(head.id, r.into()).await,
            Err(Refused::Broken(e)) => return Err(Closed::Own(e)),
            Err(Refused::Read(r)) => Err(r),
        };
        let (pipeline, tx) = (Arc::clone(pipeline), self.tx.clone());
        let tasks = pipeline.ctx().tasks().clone();
        tasks.spawn(async move {
            let (status, body) = answer(&pipeline, admitted).await;
            let _ = tx.send(encode(head.id, status, &body)).await;
            drop(permit);
        });
        Ok(())
    }

    /// Writes the refusal `e` of request `id`, after which the link is closed.
    async fn last(&self, id: u32, e: ApiError) -> Result<(), Closed> {
        let (status, body) = e.on_link();
        let _ = self.tx.send(encode(id, status, &body)).await;
        Err(Closed::Done)
    }
}

/// The stages of a frame taken in (or its refusal on the way in): its status and body at the
/// relay answers' one length.
async fn answer(pipeline: &Arc<Pipeline>, admitted: Result<Admitted, Reason>) -> (u16, Vec<u8>) {
    let processed = match admitted {
        Ok(admitted) => process_admitted(pipeline, admitted).await,
        Err(r) => Err(r.into()),
    };
    match processed {
        Ok((status, body)) => (status, pad(&body)),
        Err(e) => e.on_link(),
    }
}

/// The answer to request `id`: head and body.
fn encode(id: u32, status: u16, body: &[u8]) -> Encoded {
    let mut out = Vec::with_capacity(ANSWER_HEAD + body.len().max(ANSWER_LEN));
    out.extend_from_slice(&AnswerHead::encode(id, status, body.len()));
    out.extend_from_slice(body);
    out
}

/// Writes the answers of `rx` until every sender is gone, each batch of ready answers in one
/// write, then closes the write side. A write error, or a write the client leaves waiting for
/// `patience`, ends it (the answers left are dropped; their tasks end).
async fn write_answers<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Encoded>,
    patience: Duration,
) {
    let mut buf = Vec::new();
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&first);
        while let Ok(more) = rx.try_recv() {
            buf.extend_from_slice(&more);
        }
        let write = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        if !matches!(tokio::time::timeout(patience, write).await, Ok(Ok(()))) {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// A request head read from `rd`: `None` when the stream ended before its first byte (a clean
/// end between two frames), an error when it ended within.
async fn read_head<R: AsyncRead + Unpin>(rd: &mut R) -> io::Result<Option<[u8; REQUEST_HEAD]>> {
    let mut head = [0u8; REQUEST_HEAD];
    let mut got = 0;
    while got < head.len() {
        match rd.read(&mut head[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(Some(head))
}
