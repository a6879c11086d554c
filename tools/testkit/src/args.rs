//! Extra command-line flags per program, for the harnesses that start kjob and the control
//! plane: one rule for every binary instead of one field per binary in each harness.

use std::collections::BTreeMap;

/// A program the harnesses start with caller-chosen flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Program {
    /// kube-apiserver (real control plane).
    KubeApiserver,
    /// kube-controller-manager (real control plane).
    KubeControllerManager,
    /// kjob-node-agent, the real control plane's nodes and kubelet.
    NodeAgent,
    /// kjob-sim, the stack's API server when no real one is given.
    Sim,
    /// kjob-queue.
    Queue,
    /// Every kjob-watcher.
    Watcher,
    /// Every kjob-worker.
    Worker,
}

/// Flags appended, per program, after the ones the harness sets (so a caller's flag comes
/// last; clap refuses a repeated flag, Go's flag package keeps the last).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraArgs(BTreeMap<Program, Vec<String>>);

impl ExtraArgs {
    /// Appends `args` to `program`'s flags.
    pub fn add<I, S>(&mut self, program: Program, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.0.entry(program).or_default().extend(args.into_iter().map(Into::into));
        self
    }

    /// `program`'s flags, in the order they were added.
    pub fn of(&self, program: Program) -> &[String] {
        self.0.get(&program).map(Vec::as_slice).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_accumulate_per_program_in_order() {
        let mut extra = ExtraArgs::default();
        extra.add(Program::Worker, ["--a"]).add(Program::Sim, ["--s"]);
        extra.add(Program::Worker, vec![String::from("--b")]);
        assert_eq!(extra.of(Program::Worker), ["--a", "--b"]);
        assert_eq!(extra.of(Program::Sim), ["--s"]);
        assert!(extra.of(Program::Queue).is_empty());
    }
}
