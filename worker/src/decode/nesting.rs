//! The shape of a nested JSON array, checked while a streaming parser walks it: every array
//! at a depth as long as the first one there that ended, every value at one depth below all
//! arrays. Shared by the one-input parser (`numeric.rs`) and the named-input walk
//! (`elements.rs`); [`Ragged::message`] words what is wrong the same way for both.

/// Where the walk is and what it has learnt of the shape.
#[derive(Debug, Default)]
pub(super) struct Nesting {
    /// The length of arrays at each depth, known once the first one there has ended.
    dims: Vec<Option<usize>>,
    /// Depth of the values (set by the first one).
    leaf_depth: Option<usize>,
    /// The deepest array seen.
    deepest_array: Option<usize>,
    /// Index at each depth, for messages.
    path: Vec<usize>,
}

/// How a nesting is not regular.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ragged {
    /// An array where its siblings are values.
    ArrayAmongValues,
    /// A value where its siblings are arrays (of this many elements, when known).
    ValueAmongArrays(Option<usize>),
    /// An array of `n` elements where the first one at its depth had `want`.
    Length { n: usize, want: usize },
}

impl Ragged {
    /// The message, `here` naming the place (`inputs[1][0]`) and `what` the value found
    /// there (`a number`; not used for an array).
    pub fn message(self, here: &str, what: &str) -> String {
        match self {
            Ragged::ArrayAmongValues => {
                format!("ragged array: {here} is an array, but its siblings are values")
            }
            Ragged::ValueAmongArrays(n) => {
                let siblings = n.map_or_else(
                    || "arrays".to_string(),
                    |n| format!("arrays of {n} elements"),
                );
                format!("ragged array: {here} is {what}, but its siblings are {siblings}")
            }
            Ragged::Length { n, want } => format!(
                "ragged array: {here} has {n} elements, expected {want} like the first one at that depth"
            ),
        }
    }
}

impl Nesting {
    /// An array begins at `depth` (0: the input itself).
    pub fn array_opens(&mut self, depth: usize) -> Result<(), Ragged> {
        if self.leaf_depth.is_some_and(|l| l <= depth) {
            return Err(Ragged::ArrayAmongValues);
        }
        self.deepest_array = Some(self.deepest_array.map_or(depth, |d| d.max(depth)));
        if self.dims.len() <= depth {
            self.dims.resize(depth + 1, None);
        }
        Ok(())
    }

    /// The array at `depth` ended after `n` elements.
    pub fn array_closes(&mut self, depth: usize, n: usize) -> Result<(), Ragged> {
        match self.dims[depth] {
            Some(want) if want != n => Err(Ragged::Length { n, want }),
            Some(_) => Ok(()),
            None => {
                self.dims[depth] = Some(n);
                Ok(())
            }
        }
    }

    /// A value (not an array) at `depth`.
    pub fn value(&mut self, depth: usize) -> Result<(), Ragged> {
        let arrays_here = self.deepest_array.is_some_and(|a| a >= depth);
        if arrays_here || self.leaf_depth.is_some_and(|l| l != depth) {
            return Err(Ragged::ValueAmongArrays(
                self.dims.get(depth).copied().flatten(),
            ));
        }
        self.leaf_depth = Some(depth);
        Ok(())
    }

    /// The walk goes into element `i` of the current array.
    pub fn enter(&mut self, i: usize) {
        self.path.push(i);
    }

    /// …and comes back out.
    pub fn leave(&mut self) {
        self.path.pop();
    }

    /// The place the walk is at, as `inputs[1][0]`.
    pub fn here(&self) -> String {
        let mut s = String::from("inputs");
        for i in &self.path {
            s.push_str(&format!("[{i}]"));
        }
        s
    }

    /// The shape read so far (all of it, once the walk is done): the lengths down to the
    /// values' depth.
    pub fn shape(&self) -> Vec<i64> {
        self.dims
            .iter()
            .map_while(|d| d.map(|n| n as i64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_walk_gives_its_shape_and_each_irregularity_its_kind() {
        // [[1, 2], [3, 4], [5, 6]]
        let mut n = Nesting::default();
        n.array_opens(0).unwrap();
        for _ in 0..3 {
            n.array_opens(1).unwrap();
            n.value(2).unwrap();
            n.value(2).unwrap();
            n.array_closes(1, 2).unwrap();
        }
        n.array_closes(0, 3).unwrap();
        assert_eq!(n.shape(), [3, 2]);
        // [[1, 2], [3]]
        let mut n = Nesting::default();
        n.array_opens(0).unwrap();
        n.array_opens(1).unwrap();
        n.array_closes(1, 2).unwrap();
        n.array_opens(1).unwrap();
        assert_eq!(n.array_closes(1, 1), Err(Ragged::Length { n: 1, want: 2 }));
        // [[1], 2] and [1, [2]]
        let mut n = Nesting::default();
        n.array_opens(0).unwrap();
        n.array_opens(1).unwrap();
        n.value(2).unwrap();
        n.array_closes(1, 1).unwrap();
        assert_eq!(n.value(1), Err(Ragged::ValueAmongArrays(Some(1))));
        let mut n = Nesting::default();
        n.array_opens(0).unwrap();
        n.value(1).unwrap();
        assert_eq!(n.array_opens(1), Err(Ragged::ArrayAmongValues));
        // A scalar: shape [].
        let mut n = Nesting::default();
        n.value(0).unwrap();
        assert!(n.shape().is_empty());
        n.enter(1);
        n.enter(0);
        assert_eq!(n.here(), "inputs[1][0]");
        let m = Ragged::ValueAmongArrays(None).message(&n.here(), "a number");
        assert_eq!(
            m,
            "ragged array: inputs[1][0] is a number, but its siblings are arrays"
        );
    }
}
