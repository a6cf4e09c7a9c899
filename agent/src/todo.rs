//! The orchestrator's plan: an ordered todo list whose items move from
//! pending to in progress to done or blocked. Pure data, driven by the todo
//! tools; each item is what one sub-agent is handed.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TodoItem {
    pub name: String,
    pub goal: String,
    #[serde(default)]
    pub skills: Vec<String>,
    /// Files the item reads (paths in /workspace/input or /workspace/output).
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Files the item must leave in /workspace/output.
    #[serde(default)]
    pub outputs: Vec<String>,
    pub success_criteria: String,
    #[serde(default)]
    pub state: State,
    /// The sub-agent's report, or why the item was blocked.
    #[serde(default)]
    pub report: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum State {
    #[default]
    Pending,
    InProgress,
    Done,
    Blocked,
}

impl State {
    pub fn is_finished(self) -> bool {
        matches!(self, State::Done | State::Blocked)
    }
}

/// What a planner may send for one item: no state, no report.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedItem {
    pub name: String,
    pub goal: String,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
    #[serde(default)]
    pub outputs: Vec<String>,
    pub success_criteria: String,
}

impl From<PlannedItem> for TodoItem {
    fn from(p: PlannedItem) -> TodoItem {
        TodoItem {
            name: p.name,
            goal: p.goal,
            skills: p.skills,
            inputs: p.inputs,
            outputs: p.outputs,
            success_criteria: p.success_criteria,
            state: State::Pending,
            report: None,
        }
    }
}

/// Most items a plan may have.
pub const MAX_ITEMS: usize = 20;
/// Longest item name, in bytes (names are echoed in every listing).
pub const MAX_NAME_BYTES: usize = 80;
/// Longest goal or success criteria, in bytes.
pub const MAX_TEXT_BYTES: usize = 1000;
/// Most skills, inputs or outputs an item may list, and the longest of each.
pub const MAX_LIST: usize = 20;
pub const MAX_ENTRY_BYTES: usize = 200;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TodoList {
    pub items: Vec<TodoItem>,
    created: bool,
}

impl TodoList {
    pub fn is_created(&self) -> bool {
        self.created
    }

    pub fn create(&mut self, items: Vec<PlannedItem>) -> Result<(), String> {
        if self.created {
            return Err("the todo list already exists; use revise_todo_list to change what is not finished".into());
        }
        check_plan(&items, 0)?;
        self.items = items.into_iter().map(TodoItem::from).collect();
        self.created = true;
        Ok(())
    }

    /// Replace every item that is not finished with `items`; finished items
    /// keep their place and their reports.
    pub fn revise(&mut self, items: Vec<PlannedItem>) -> Result<(), String> {
        if !self.created {
            return Err("there is no todo list yet; call create_todo_list first".into());
        }
        if self.items.iter().any(|i| i.state == State::InProgress) {
            return Err("an item is in progress; revise the list after it finishes".into());
        }
        let finished = self.items.iter().filter(|i| i.state.is_finished()).count();
        check_plan(&items, finished)?;
        self.items.retain(|i| i.state.is_finished());
        for item in items {
            if self.items.iter().any(|i| i.name == item.name) {
                return Err(format!("an item named `{}` is already finished; give new items new names", item.name));
            }
            self.items.push(item.into());
        }
        Ok(())
    }

    /// Mark the next pending item in progress and return its index.
    pub fn start_next(&mut self) -> Option<usize> {
        let i = self.items.iter().position(|i| i.state == State::Pending)?;
        self.items[i].state = State::InProgress;
        Some(i)
    }

    pub fn finish(&mut self, index: usize, state: State, report: String) {
        if let Some(item) = self.items.get_mut(index) {
            item.state = state;
            item.report = Some(report);
        }
    }

    /// Block a pending item by name (the orchestrator skipping it).
    pub fn block_pending(&mut self, name: &str, reason: String) -> Result<(), String> {
        let Some(item) = self.items.iter_mut().find(|i| i.name == name) else {
            let names: Vec<&str> = self.items.iter().map(|i| i.name.as_str()).collect();
            return Err(format!("no item named `{}`; the items are: {}", crate::escape::shown(name), names.join(", ")));
        };
        if item.state != State::Pending {
            return Err(format!(
                "item `{}` is {:?}, only a pending item can be blocked here",
                crate::escape::shown(name),
                item.state
            ));
        }
        item.state = State::Blocked;
        item.report = Some(reason);
        Ok(())
    }

    pub fn pending(&self) -> usize {
        self.items.iter().filter(|i| !i.state.is_finished()).count()
    }

    /// The list as the model sees it: one line an item.
    pub fn render(&self) -> String {
        if self.items.is_empty() {
            return "(the todo list is empty)".into();
        }
        self.items
            .iter()
            .enumerate()
            .map(|(n, i)| {
                let state = match i.state {
                    State::Pending => "pending",
                    State::InProgress => "in progress",
                    State::Done => "done",
                    State::Blocked => "blocked",
                };
                format!("{}. [{state}] {}: {}", n + 1, i.name, i.goal)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn check_plan(items: &[PlannedItem], finished: usize) -> Result<(), String> {
    if items.is_empty() && finished == 0 {
        return Err("the plan needs at least one item".into());
    }
    if items.len() + finished > MAX_ITEMS {
        return Err(format!("a plan has at most {MAX_ITEMS} items; merge some"));
    }
    for (n, i) in items.iter().enumerate() {
        if i.name.trim().is_empty() || i.goal.trim().is_empty() || i.success_criteria.trim().is_empty() {
            return Err(format!("item {} needs a name, a goal and success criteria", n + 1));
        }
        if i.name.len() > MAX_NAME_BYTES {
            return Err(format!(
                "item {} has a name of {} bytes; give it a short plain name of at most {MAX_NAME_BYTES} bytes",
                n + 1,
                i.name.len()
            ));
        }
        if let Some(c) = i.name.chars().find(|&c| crate::escape::needs_escape(c)) {
            return Err(format!(
                "item {}'s name holds a control or invisible character ({}); give it a plain name of letters, digits, spaces and punctuation",
                n + 1,
                crate::escape::escape(&c.to_string(), crate::escape::Lines::One)
            ));
        }
        if i.goal.len() > MAX_TEXT_BYTES || i.success_criteria.len() > MAX_TEXT_BYTES {
            return Err(format!("item {}: the goal and the success criteria have at most {MAX_TEXT_BYTES} bytes each", n + 1));
        }
        let lists = [&i.skills, &i.inputs, &i.outputs];
        if lists.iter().any(|l| l.len() > MAX_LIST || l.iter().any(|e| e.len() > MAX_ENTRY_BYTES)) {
            return Err(format!(
                "item {}: skills, inputs and outputs list at most {MAX_LIST} entries of at most {MAX_ENTRY_BYTES} bytes",
                n + 1
            ));
        }
        if items[..n].iter().any(|j| j.name == i.name) {
            return Err(format!("two items are named `{}`; names must be unique", i.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(name: &str) -> PlannedItem {
        PlannedItem {
            name: name.into(),
            goal: "g".into(),
            skills: vec![],
            inputs: vec![],
            outputs: vec![],
            success_criteria: "s".into(),
        }
    }

    #[test]
    fn items_move_from_pending_to_finished_in_order() {
        let mut t = TodoList::default();
        t.create(vec![planned("a"), planned("b")]).unwrap();
        assert_eq!(t.start_next(), Some(0));
        t.finish(0, State::Done, "ok".into());
        assert_eq!(t.start_next(), Some(1));
        t.finish(1, State::Blocked, "no".into());
        assert_eq!(t.start_next(), None);
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn revising_keeps_finished_items_and_replaces_the_rest() {
        let mut t = TodoList::default();
        t.create(vec![planned("a"), planned("b")]).unwrap();
        t.start_next();
        t.finish(0, State::Done, "ok".into());
        t.revise(vec![planned("c")]).unwrap();
        let names: Vec<_> = t.items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert!(t.revise(vec![planned("a")]).is_err());
        assert!(t.create(vec![planned("x")]).is_err());
    }

    #[test]
    fn a_plan_with_duplicate_or_empty_items_is_refused() {
        let mut t = TodoList::default();
        assert!(t.create(vec![]).is_err());
        assert!(t.create(vec![planned("a"), planned("a")]).is_err());
        let mut bad = planned("a");
        bad.goal = " ".into();
        assert!(t.create(vec![bad]).is_err());
        for name in ["x".repeat(5 << 20), "a\u{1b}[2Jb".into()] {
            let e = t.create(vec![planned(&name)]).unwrap_err();
            assert!(e.len() < 300, "{e}");
        }
    }

    #[test]
    fn a_bad_item_name_is_refused_for_what_is_wrong_with_it() {
        let mut t = TodoList::default();
        // 52 bytes with an escape sequence: refused for the control character, not its length.
        let name = format!("{}\u{1b}[2J", "n".repeat(48));
        assert_eq!(name.len(), 52);
        let e = t.create(vec![planned(&name)]).unwrap_err();
        assert!(e.contains("control or invisible character (\\x1b)") && !e.contains("bytes"), "{e}");
        let e = t.create(vec![planned(&"n".repeat(81))]).unwrap_err();
        assert!(e.contains("a name of 81 bytes") && e.contains("at most 80 bytes") && !e.contains("control"), "{e}");
        let e = t.create(vec![planned("a\u{202e}b")]).unwrap_err();
        assert!(e.contains("(\\u{202e})"), "{e}");
    }
}
