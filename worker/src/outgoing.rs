//! An answer's body on its way out ([`Outgoing`]): it tells its connection (`conn.rs`) when
//! its next frame waits on the client, from the moment it is handed to hyper or has given a
//! frame until hyper asks for the next one. hyper asks for the next frame of an HTTP/2
//! answer only once the client's window has room for the one before, so an answer whose
//! client keeps its window shut waits here, and the connection is dropped once it has
//! waited [`UNREAD`](crate::timeouts::UNREAD). An answer that waits on the model or on a
//! stream's next request (hyper asked, the body has nothing yet) does not wait on the client.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

use crate::conn::ConnState;

pub struct Outgoing<B> {
    body: B,
    conn: Arc<ConnState>,
    id: u64,
}

impl<B> Outgoing<B> {
    pub fn new(body: B, conn: Arc<ConnState>) -> Outgoing<B> {
        let id = conn.new_answer();
        conn.answer_waits(id);
        Outgoing { body, conn, id }
    }
}

impl<B: Body + Unpin> Body for Outgoing<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let me = self.get_mut();
        me.conn.answer_moves(me.id);
        let r = Pin::new(&mut me.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &r {
            me.conn.answer_waits(me.id);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Outgoing<B> {
    fn drop(&mut self) {
        self.conn.answer_moves(self.id);
    }
}
