//! A `petgraph` view of a trace's dataflow: ops are nodes, and an edge carries
//! the value one op passes to another. petgraph's indices stay in this module.

use petgraph::Direction;
use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::ir::{OpId, Trace, ValueId};

/// The dataflow graph of a trace.
#[derive(Debug, Clone)]
pub struct DataflowGraph {
    graph: DiGraph<OpId, ValueId>,
}

impl DataflowGraph {
    /// Builds the graph: one node per op (node index = op index), one edge per
    /// (producer, consumer, value) use.
    pub fn new(trace: &Trace) -> DataflowGraph {
        let mut graph = DiGraph::with_capacity(trace.ops.len(), trace.ops.len() * 2);
        for (id, _) in trace.ops_with_ids() {
            graph.add_node(id);
        }
        let producers = trace.producers();
        for (id, op) in trace.ops_with_ids() {
            for v in op.input_values() {
                if let Some(p) = producers[v.index()] {
                    graph.add_edge(NodeIndex::new(p.index()), NodeIndex::new(id.index()), v);
                }
            }
        }
        DataflowGraph { graph }
    }

    fn ops_in(&self, op: OpId, dir: Direction) -> Vec<OpId> {
        let mut v: Vec<OpId> = self
            .graph
            .neighbors_directed(NodeIndex::new(op.index()), dir)
            .map(|n| self.graph[n])
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Ops that read a value this op defines, in program order.
    pub fn consumers(&self, op: OpId) -> Vec<OpId> {
        self.ops_in(op, Direction::Outgoing)
    }

    /// Ops that define a value this op reads, in program order.
    pub fn producers(&self, op: OpId) -> Vec<OpId> {
        self.ops_in(op, Direction::Incoming)
    }

    /// Number of ops.
    pub fn op_count(&self) -> usize {
        self.graph.node_count()
    }

    /// Number of (producer, consumer, value) edges.
    pub fn edge_count(&self) -> usize {
        self.graph.edge_count()
    }

    /// A topological order of the ops, or `None` if the graph has a cycle.
    pub fn topological_order(&self) -> Option<Vec<OpId>> {
        toposort(&self.graph, None)
            .ok()
            .map(|nodes| nodes.into_iter().map(|n| self.graph[n]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    #[test]
    fn edges_follow_dataflow() {
        let t = parse("input x: f32[2]\na = relu(x)\nb = exp(a)\nc = add(a, b)\nd = neg(x)\noutput c, d\n")
            .unwrap();
        let g = DataflowGraph::new(&t);
        assert_eq!(g.op_count(), 4);
        // a->b, a->c, b->c; x is an input, so neg has no producer.
        assert_eq!(g.edge_count(), 3);
        assert_eq!(g.consumers(OpId(0)), vec![OpId(1), OpId(2)]);
        assert_eq!(g.producers(OpId(2)), vec![OpId(0), OpId(1)]);
        assert!(g.producers(OpId(3)).is_empty());
        let order = g.topological_order().unwrap();
        let pos = |o: OpId| order.iter().position(|&x| x == o).unwrap();
        assert!(pos(OpId(0)) < pos(OpId(1)) && pos(OpId(1)) < pos(OpId(2)));
    }
}
