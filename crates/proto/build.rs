//! Compiles proto/kjob/queue/v1 with protox (pure Rust), so a fresh machine needs no protoc.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not baked in with env!(): a build script compiled in one checkout and
    // reused from a copied target/ in another must read that checkout's proto files.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let file = root.join("kjob/queue/v1/queue.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The descriptor set also feeds grpc server reflection.
    std::fs::write(out.join("kjob_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
