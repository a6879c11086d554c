//! kjob-queue: the gRPC queue service over the Redis workqueue
