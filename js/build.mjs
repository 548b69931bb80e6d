// Builds the committed browser files and HubAgent's module from js/src:
//
//   src/client.ts -> ../agui_hub/static/agui-hub.js   (ES module, @msgpack/msgpack bundled)
//                    ../agui_hub/static/agui-hub.d.ts (its types, one file)
//   src/viewer.ts -> ../agui_hub/static/viewer.js     (the viewer page's script)
//   src/agent.ts  -> dist/agent.js                    (HubAgent; @ag-ui/*, rxjs external)
//
// `node build.mjs --outdir DIR` writes the same files under DIR (DIR/agui_hub/static/...,
// DIR/js/dist/...) instead: the tests build there and compare with the committed files,
// so the output must be the same bytes for the same sources (no timestamps, no absolute
// paths, no source maps).

import { mkdirSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import ts from "typescript";

const JS_DIR = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(JS_DIR, "..");

function parseArgs(argv) {
  let outdir = ROOT;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--outdir" && i + 1 < argv.length) outdir = resolve(argv[++i]);
    else if (argv[i].startsWith("--outdir=")) outdir = resolve(argv[i].slice("--outdir=".length));
    else {
      console.error(`usage: node build.mjs [--outdir DIR]\nunknown argument: ${argv[i]}`);
      process.exit(2);
    }
  }
  return outdir;
}

const OUT = parseArgs(process.argv.slice(2));
const STATIC = join(OUT, "agui_hub", "static");
const DIST = join(OUT, "js", "dist");

function banner(what) {
  return `// ${what}: generated from js/src by \`npm run build\` (agui-hub); do not edit.`;
}

function write(path, text) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  console.log(`wrote ${relative(process.cwd(), path) || path}`);
}

async function bundle(entry, outfile, what, options = {}) {
  const result = await build({
    absWorkingDir: JS_DIR, // paths in the output's comments are relative to js/
    entryPoints: [entry],
    bundle: true,
    format: "esm",
    target: "es2022",
    platform: "browser",
    minify: false,
    sourcemap: false,
    charset: "utf8",
    legalComments: "inline",
    banner: { js: banner(what) },
    write: false,
    logLevel: "warning",
    ...options,
  });
  const [file] = result.outputFiles;
  write(outfile, file.text);
}

/** The client's declarations, one file (client.ts is one module: nothing to stitch). */
function declarations(entry, outfile) {
  const options = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    types: [],
    strict: true,
    skipLibCheck: true,
    declaration: true,
    emitDeclarationOnly: true,
    stripInternal: true,
    removeComments: false,
    newLine: ts.NewLineKind.LineFeed,
  };
  const program = ts.createProgram([join(JS_DIR, entry)], options);
  const diagnostics = ts.getPreEmitDiagnostics(program);
  if (diagnostics.length > 0) {
    const host = {
      getCanonicalFileName: (f) => f,
      getCurrentDirectory: () => JS_DIR,
      getNewLine: () => "\n",
    };
    console.error(ts.formatDiagnostics(diagnostics, host));
    process.exit(1);
  }
  let text = null;
  const result = program.emit(undefined, (name, data) => {
    if (name.endsWith("client.d.ts")) text = data;
  });
  if (result.emitSkipped || text === null) {
    console.error("no declarations emitted for the client");
    process.exit(1);
  }
  if (/^\s*import\s/m.test(text)) {
    console.error("the client's declarations import another module: keep them one file");
    process.exit(1);
  }
  write(outfile, `${banner("agui-hub.d.ts")}\n${text}`);
}

await bundle("src/client.ts", join(STATIC, "agui-hub.js"), "agui-hub.js");
declarations("src/client.ts", join(STATIC, "agui-hub.d.ts"));
if (existsSync(join(JS_DIR, "src", "viewer.ts"))) {
  await bundle("src/viewer.ts", join(STATIC, "viewer.js"), "viewer.js");
}
if (existsSync(join(JS_DIR, "src", "agent.ts"))) {
  await bundle("src/agent.ts", join(DIST, "agent.js"), "agent.js", {
    platform: "neutral",
    mainFields: ["module", "main"],
    external: ["@ag-ui/client", "@ag-ui/core", "rxjs", "rxjs/*"],
  });
}
