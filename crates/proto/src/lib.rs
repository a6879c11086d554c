//! Generated tonic/prost code for the kjob queue contract (`proto/kjob/queue/v1/queue.proto`),
//! and [`convert`], its one conversion edge with kjob's queue vocabulary.

pub mod convert;

/// `kjob.queue.v1`: the workqueue and expectations services.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("kjob.queue.v1");
}

/// Encoded file descriptor set of the kjob protos, for grpc server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kjob_descriptor.bin"));
