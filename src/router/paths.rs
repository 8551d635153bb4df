//! The path prefixes and exact paths of one host's routes, in a radix tree of bytes: one
//! walk down a request's path meets every route whose prefix it starts with, the routes
//! of exactly that path, and the `path_regex` routes whose every match starts with one of
//! its prefixes, however many routes there are.
//!
//! Written here rather than taken from a crate: the tries on crates.io answer "the
//! longest prefix" or allocate the keys they return, while routing needs every prefix
//! (the first route in file order wins, not the longest), with no allocation.

/// Route numbers (file order), ascending.
pub type Routes = Vec<u32>;

#[derive(Debug, Default)]
pub struct Paths {
    /// `nodes[0]` is the root, the empty prefix.
    nodes: Vec<Node>,
}

#[derive(Debug, Default)]
pub struct Node {
    /// The bytes from the parent to this node (empty for the root only).
    label: Box<[u8]>,
    /// The children, by the first byte of their label, ascending.
    children: Vec<(u8, u32)>,
    /// Routes whose prefix ends here.
    pub prefix: Routes,
    /// Routes whose exact path ends here.
    pub exact: Routes,
    /// `path_regex` routes anchored with this literal start: route, and its pattern's
    /// index in `Router::patterns`.
    pub regex: Vec<(u32, u32)>,
}

impl Paths {
    /// The node of `key`, made if need be: routes are added to its lists in ascending
    /// order.
    pub fn node(&mut self, key: &[u8]) -> &mut Node {
        if self.nodes.is_empty() {
            self.nodes.push(Node::default());
        }
        let mut node = 0;
        let mut rest = key;
        while let Some(&first) = rest.first() {
            let at = self.nodes[node].children.binary_search_by_key(&first, |&(b, _)| b);
            let child = match at {
                Err(at) => {
                    let child = self.add(rest);
                    self.nodes[node].children.insert(at, (first, child));
                    node = child as usize;
                    break;
                }
                Ok(at) => self.nodes[node].children[at].1 as usize,
            };
            let label = &self.nodes[child].label;
            let common = label.iter().zip(rest).take_while(|(a, b)| a == b).count();
            if common < label.len() {
                // Split the edge where `key` leaves it: a new node for the common part.
                let (head, tail) = label.split_at(common);
                let (head, tail): (Box<[u8]>, Box<[u8]>) = (head.into(), tail.into());
                let middle = self.add(&head);
                self.nodes[middle as usize].children.push((tail[0], child as u32));
                self.nodes[child].label = tail;
                let at = at.unwrap_or_else(|_| unreachable!("found above"));
                self.nodes[node].children[at].1 = middle;
                node = middle as usize;
            } else {
                node = child;
            }
            rest = &rest[common..];
        }
        &mut self.nodes[node]
    }

    fn add(&mut self, label: &[u8]) -> u32 {
        self.nodes.push(Node { label: label.into(), ..Node::default() });
        u32::try_from(self.nodes.len() - 1).unwrap_or(u32::MAX)
    }

    /// Calls `each` with the node of every prefix of `path` in the tree, and whether it is
    /// `path` itself.
    pub fn walk(&self, path: &[u8], mut each: impl FnMut(&Node, bool)) {
        let Some(mut node) = self.nodes.first() else { return };
        let mut rest = path;
        loop {
            let Some(&first) = rest.first() else {
                each(node, true);
                return;
            };
            each(node, false);
            let Ok(at) = node.children.binary_search_by_key(&first, |&(b, _)| b) else { return };
            node = &self.nodes[node.children[at].1 as usize];
            match rest.strip_prefix(&*node.label) {
                Some(after) => rest = after,
                None => return,
            }
        }
    }

    /// Drops the spare capacity building left.
    pub fn shrink(&mut self) {
        self.nodes.shrink_to_fit();
        for node in &mut self.nodes {
            node.children.shrink_to_fit();
            node.prefix.shrink_to_fit();
            node.exact.shrink_to_fit();
            node.regex.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(paths: &Paths, path: &str) -> Vec<u32> {
        let mut all = Vec::new();
        paths.walk(path.as_bytes(), |node, whole| {
            all.extend_from_slice(&node.prefix);
            if whole {
                all.extend_from_slice(&node.exact);
            }
        });
        all.sort_unstable();
        all
    }

    #[test]
    fn a_walk_meets_every_prefix_of_the_path_and_the_exact_path() {
        let mut paths = Paths::default();
        for (i, (key, exact)) in [
            ("/api/", false),
            ("/a", false),
            ("/api", true),
            ("/api/v1", false),
            ("/", false),
            ("/b", true),
            ("", false),
        ]
        .into_iter()
        .enumerate()
        {
            let node = paths.node(key.as_bytes());
            if exact { &mut node.exact } else { &mut node.prefix }.push(i as u32);
        }
        assert_eq!(found(&paths, "/api/v1/x"), [0, 1, 3, 4, 6]);
        assert_eq!(found(&paths, "/api"), [1, 2, 4, 6]);
        assert_eq!(found(&paths, "/ap"), [1, 4, 6]);
        assert_eq!(found(&paths, "/b"), [4, 5, 6]);
        assert_eq!(found(&paths, "/bc"), [4, 6]);
        assert_eq!(found(&paths, "x"), [6]);
    }

    #[test]
    fn an_empty_tree_finds_nothing() {
        assert_eq!(found(&Paths::default(), "/"), Vec::<u32>::new());
    }
}
