//! Skills: markdown files that teach the model how to do one kind of step in
//! this sandbox. The model sees each skill's name and one line; it reads a
//! skill in full with `read_skill` only when it needs it. The skills in
//! `agent/skills/` are built into the binary; `--skills DIR` adds or
//! replaces skills from a folder of `*.md` files.
//!
//! A skill file starts with a front matter block:
//! `---` / `name: eda` / `description: one line` / `---`.

use std::path::Path;

const BUILTIN: &[&str] = &[
    include_str!("../skills/python-scripts.md"),
    include_str!("../skills/eda.md"),
    include_str!("../skills/charts.md"),
    include_str!("../skills/presentation.md"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub body: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    #[error("skill file {path} has no front matter with `name:` and `description:`")]
    FrontMatter { path: String },
    #[error("cannot read skills dir {path}: {error}")]
    ReadDir { path: String, error: std::io::Error },
}

/// Parse one skill file.
pub fn parse(text: &str) -> Option<Skill> {
    let rest = text.strip_prefix("---\n")?;
    let (front, body) = rest.split_once("\n---\n")?;
    let field = |key: &str| {
        front
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .filter(|v| !v.is_empty())
    };
    Some(Skill {
        name: field("name:")?,
        description: field("description:")?,
        body: body.trim_start().to_string(),
    })
}

#[derive(Debug, Clone)]
pub struct Skills {
    pub skills: Vec<Skill>,
}

impl Skills {
    /// The built-in skills, plus those in `dir` (which win on a name clash).
    pub fn load(dir: Option<&Path>) -> Result<Skills, SkillError> {
        let mut skills: Vec<Skill> = BUILTIN.iter().filter_map(|t| parse(t)).collect();
        if let Some(dir) = dir {
            let read = std::fs::read_dir(dir).map_err(|error| SkillError::ReadDir { path: dir.display().to_string(), error })?;
            let mut paths: Vec<_> =
                read.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect();
            paths.sort();
            for p in paths {
                let text =
                    std::fs::read_to_string(&p).map_err(|error| SkillError::ReadDir { path: p.display().to_string(), error })?;
                let skill = parse(&text).ok_or_else(|| SkillError::FrontMatter { path: p.display().to_string() })?;
                skills.retain(|s| s.name != skill.name);
                skills.push(skill);
            }
        }
        Ok(Skills { skills })
    }

    /// One line a skill, for a system prompt.
    pub fn index(&self) -> String {
        self.skills
            .iter()
            .map(|s| format!("- {}: {}", s.name, s.description))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        let name = name.trim().trim_end_matches(".md");
        self.skills.iter().find(|s| s.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.skills.iter().map(|s| s.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_skill_parses_and_the_required_ones_exist() {
        assert_eq!(BUILTIN.iter().filter_map(|t| parse(t)).count(), BUILTIN.len());
        let s = Skills::load(None).unwrap();
        for name in ["python-scripts", "eda", "charts", "presentation"] {
            let skill = s.get(name).unwrap_or_else(|| panic!("no skill {name}"));
            assert!(skill.body.contains("/workspace/"), "{name} does not speak of the sandbox's paths");
            assert!(!skill.description.contains('\n'));
        }
    }

    #[test]
    fn a_skill_without_front_matter_is_not_a_skill() {
        assert_eq!(parse("# just markdown\n"), None);
        assert_eq!(parse("---\nname: x\n---\nbody"), None);
    }
}
