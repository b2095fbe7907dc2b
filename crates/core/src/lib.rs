//! # switchyard-core
//!
//! The executor layer's common ground. A tensor program is a [`Trace`]: inputs,
//! ops in program order, outputs, each value with dtype, shape, strides and
//! device. Primitive ops are what executors run; composite ops carry a
//! decomposition into primitives, so an executor can claim one whole or leave it
//! to be lowered. Traces are written in a line-oriented text format
//! ([`text`]) that prints and parses back to the same trace, or built in Rust with
//! [`ir::TraceBuilder`]; every op is shape- and dtype-checked as it is added.
//!
//! Executors implement [`executor::Executor`] (claim, refine, cost, compile)
//! and register at link time with `inventory`; core names none of them.
//! [`config`] chooses the executors and their options; the [`partition`]er
//! assigns every op to an executor by cost (a [`cost`] model of the device) and
//! cuts the lowered trace into regions, explaining each choice; the
//! [`runtime`] compiles each region once and runs the plan many times, freeing
//! each value after its last use and measuring peak memory; it writes
//! intermediates into an arena kept between runs and outputs into buffers
//! the caller hands back or gives ([`runtime::CompiledPlan::recycle`],
//! [`runtime::CompiledPlan::run_into`]), large ones on huge pages
//! ([`pages`]). [`threads`] sizes the CPU kernels' thread pool. Device layers
//! plug in through [`device`].
#![deny(missing_docs)]

pub mod arena;
pub mod autotune;
pub mod buffer;
pub mod cache;
pub mod capacity;
pub mod check;
pub mod config;
pub mod cost;
pub mod device;
pub mod dtype;
pub mod epilogue;
pub mod error;
pub mod executor;
pub mod explain;
pub mod fit;
pub mod graph;
pub mod hints;
pub mod io;
pub mod ir;
pub mod kept;
#[cfg(test)]
mod layering;
mod memo;
pub mod memory;
pub mod meta;
mod outputs;
pub mod pages;
pub mod partition;
pub mod pipeline;
pub mod plan;
pub mod plugin;
pub mod report;
pub mod rng;
pub mod runtime;
pub mod schedule;
pub mod stats;
pub mod tensor;
pub mod text;
pub mod threads;
pub mod verify;
pub mod work;

pub use arena::OutputBuffer;
pub use dtype::{DType, Element, Scalar};
pub use error::{Error, Result};
pub use ir::{Trace, TraceBuilder};
pub use meta::{Device, TensorMeta};
pub use tensor::{FloatStored, HostData, HostDataMut, Storage, Stored, Tensor};

/// Re-exported so executors name the same `half` types as core.
pub use half;
/// Re-exported so executors register with the same `inventory` as core.
pub use inventory;
