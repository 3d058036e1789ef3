import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Keeps the manual pages, the completions and the user guide true to the program: every
// command and option `docfs --help` lists must be in its generated manual page and in
// docs/user-guide/, and every `-o` option the mount accepts in docs/user-guide/ and in
// mount.fuse.docfs(8). A command or option added without its documentation fails here.

/// The repository's root (this file is Tests/DocfsTests/DocfsDocumentationTests.swift).
private let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

/// What `docfs --help` and each command's `--help` say.
struct HelpPages {
    /// The commands, from `docfs --help`'s SUBCOMMANDS.
    var commands: [String] = []
    /// The options of `docfs` itself ("" ) and of each command: `--long` and `-s` spellings.
    var options: [String: [String]] = [:]

    /// The names listed in a help text's section (`SUBCOMMANDS:`, `OPTIONS:`), one per entry.
    static func section(_ title: String, of help: String) -> [String] {
        var inside = false
        var entries: [String] = []
        for line in help.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasSuffix(":"), !line.hasPrefix(" ") {
                inside = line == "\(title):"
                continue
            }
            // An entry starts two spaces in; its description's continuation lines further in.
            guard inside, line.hasPrefix("  "), !line.hasPrefix("   ") else { continue }
            entries.append(String(line.dropFirst(2)))
        }
        return entries
    }

    static func commands(in help: String) -> [String] {
        // Entries are `name   abstract`; the section ends with "See 'docfs help …'".
        section("SUBCOMMANDS", of: help).compactMap { $0.split(separator: " ").first.map(String.init) }
            .filter { $0.range(of: "^[a-z][a-z-]*$", options: .regularExpression) != nil }
    }

    /// `-h, --help`, `--print/--xml/--binary`, `-o, --output <output>`: every spelling.
    static func options(in help: String) -> [String] {
        section("OPTIONS", of: help).flatMap { entry -> [String] in
            let spec = entry.prefix { $0 != "<" }.components(separatedBy: "  ").first ?? ""
            return spec.split(whereSeparator: { $0 == "," || $0 == "/" || $0 == " " })
                .map(String.init).filter { $0.hasPrefix("-") }
        }
    }
}

/// The `-o` options of `docfs mount`, read from the parser itself (`FuseOptions.apply` and
/// `FuseOptions.ignored` in Sources/docfs/MountSupport.swift): names, `name=value` for options
/// with a fixed set of values, and the prefixes it ignores (`x-`, `comment=`).
enum MountOptionNames {
    static func read() throws -> (names: [String], values: [String]) {
        let source = try String(
            contentsOf: repository.appendingPathComponent("Sources/docfs/MountSupport.swift"), encoding: .utf8)
        let lines = source.components(separatedBy: "\n")
        let start = try #require(lines.firstIndex { $0.contains("mutating func apply(_ option: String)") })
        let switchLine = try #require(lines[start...].firstIndex { $0.contains("switch name {") })
        var names: [String] = []
        var values: [String] = []
        var depth = 0
        var current: [String] = []
        for line in lines[switchLine...] {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("case "), depth == 1 {
                current = literals(in: trimmed.prefix { $0 != ":" })
                names += current
            } else if trimmed.hasPrefix("case "), depth == 2 {
                values += literals(in: trimmed.prefix { $0 != ":" }).flatMap { value in
                    current.map { "\($0)=\(value)" }
                }
            } else if trimmed.hasPrefix("default:"), depth == 1 {
                current = []
                // `name.hasPrefix("x-") || name == "comment"`: ignored, like the set below.
                if let range = trimmed.range(of: #"hasPrefix\("([^"]+)"\)"#, options: .regularExpression) {
                    names += literals(in: trimmed[range])
                }
            } else if depth == 1, current.isEmpty {
                for match in matches(#"hasPrefix\("([^"]+)"\)|name == "([^"]+)""#, in: trimmed) {
                    names.append(match.hasSuffix("-") ? match : match + "=")
                }
            }
            depth += line.filter { $0 == "{" }.count - line.filter { $0 == "}" }.count
            if depth <= 0, line.contains("}") { break }
        }
        let setStart = try #require(lines.firstIndex { $0.contains("static let ignored: Set<String> = [") })
        for line in lines[setStart...] {
            names += literals(in: Substring(line.replacingOccurrences(of: "Set<String>", with: "")))
            if line.contains("]"), !line.contains("= [") { break }
        }
        return (Array(Set(names)).sorted(), Array(Set(values)).sorted())
    }

    /// The string literals in `text`.
    static func literals(in text: Substring) -> [String] {
        matches(#""([^"]*)""#, in: String(text))
    }

    /// The first capture group of each match (or the second, when the first did not take part).
    static func matches(_ pattern: String, in text: String) -> [String] {
        let expression = try! NSRegularExpression(pattern: pattern)
        let range = NSRange(text.startIndex..., in: text)
        return expression.matches(in: text, range: range).compactMap { match in
            (1..<match.numberOfRanges).lazy.compactMap { Range(match.range(at: $0), in: text) }.first
                .map { String(text[$0]) }
        }
    }
}

/// Whether `text` has `word` with no letter, digit, `_` or `-` right before or after it.
func mentions(_ text: String, _ word: String) -> Bool {
    let escaped = NSRegularExpression.escapedPattern(for: word)
    let edge = word.hasSuffix("=") || word.hasSuffix("-") ? "" : "(?![A-Za-z0-9_-])"
    return text.range(of: "(?<![A-Za-z0-9_-])" + escaped + edge, options: .regularExpression) != nil
}

@Suite("docfs documentation", .serialized)
struct DocfsDocumentationTests {
    let sandbox: Sandbox

    init() throws { sandbox = try Sandbox() }

    /// `docfs --help`, then every command's `--help`.
    func help() throws -> HelpPages {
        var pages = HelpPages()
        let top = try sandbox.run(["--help"])
        #expect(top.status == 0, "\(top)")
        pages.commands = HelpPages.commands(in: top.stdout)
        pages.options[""] = HelpPages.options(in: top.stdout)
        for command in pages.commands {
            let help = try sandbox.run([command, "--help"])
            #expect(help.status == 0, "\(command): \(help)")
            pages.options[command] = HelpPages.options(in: help.stdout)
        }
        return pages
    }

    /// The user guide, all of it.
    func userGuide() throws -> String {
        let folder = repository.appendingPathComponent("docs/user-guide")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".md") }
        #expect(!files.isEmpty)
        return try files.sorted().map {
            try String(contentsOf: folder.appendingPathComponent($0), encoding: .utf8)
        }.joined(separator: "\n")
    }

    @Test("docfs --help lists the commands, each with options")
    func helpIsRead() throws {
        let pages = try help()
        #expect(pages.commands.count >= 12, "\(pages.commands)")
        for name in ["create", "ls", "mount", "unmount", "plist", "retention"] {
            #expect(pages.commands.contains(name), "\(name) is not in docfs --help")
        }
        #expect(pages.options["mount"]?.contains("-o") == true, "\(pages.options["mount"] ?? [])")
        #expect(pages.options["plist"]?.contains("--xml") == true, "\(pages.options["plist"] ?? [])")
        #expect(pages.options["export"]?.contains("-f") == true, "\(pages.options["export"] ?? [])")
    }

    @Test("every command has a generated manual page that names each of its options")
    func manualPages() throws {
        let pages = try help()
        let folder = try ManualPages.generate(program: try #require(Docfs.program), in: sandbox)
        let main = try String(contentsOf: folder.appendingPathComponent("docfs.1"), encoding: .utf8)
        for option in pages.options[""] ?? [] {
            let named = ManualPages.names(main, option)
            #expect(named, "docfs.1 lacks \(option)")
        }
        for command in pages.commands {
            let referred = main.contains(".Xr docfs.\(command) 1")
            #expect(referred, "docfs.1 does not refer to docfs.\(command)(1)")
            let file = folder.appendingPathComponent("docfs.\(command).1")
            guard let page = try? String(contentsOf: file, encoding: .utf8) else {
                Issue.record("no manual page for docfs \(command) (\(file.lastPathComponent))")
                continue
            }
            let titled = page.contains(".Nm \"docfs \(command)\"")
            #expect(titled, "docfs.\(command).1 is not that command's page")
            for option in pages.options[command] ?? [] {
                let named = ManualPages.names(page, option)
                #expect(named, "docfs.\(command).1 lacks \(option)")
            }
        }
    }

    @Test("the bash, zsh and fish completions name every command")
    func completions() throws {
        let pages = try help()
        for shell in ["bash", "zsh", "fish"] {
            let script = try sandbox.run(["--generate-completion-script", shell])
            #expect(script.status == 0, "\(shell): \(script)")
            for command in pages.commands {
                let named = mentions(script.stdout, command)
                #expect(named, "the \(shell) completion lacks \(command)")
            }
        }
    }

    @Test("the user guide names every command and every option docfs --help lists")
    func userGuideHasTheCommands() throws {
        let pages = try help()
        let guide = try userGuide()
        for command in pages.commands {
            let named = guide.contains("docfs \(command)")
            #expect(named, "docs/user-guide/ never names docfs \(command)")
        }
        for (command, options) in pages.options {
            for option in options {
                let named = mentions(guide, option)
                #expect(named, "docs/user-guide/ lacks \(option) (of docfs\(command.isEmpty ? "" : " " + command))")
            }
        }
    }

    @Test("the user guide and mount.fuse.docfs(8) name every -o option the mount accepts")
    func mountOptions() throws {
        let (names, values) = try MountOptionNames.read()
        // The parser's own table: if reading it breaks, say so rather than pass on nothing.
        for known in ["ro", "allow_other", "quiet_interval", "archives", "nosuid", "x-", "comment="] {
            #expect(names.contains(known), "\(known) was not found in FuseOptions: \(names)")
        }
        #expect(values.contains("archives=xml"), "\(values)")
        let guide = try userGuide()
        let page = try String(
            contentsOf: repository.appendingPathComponent("docs/man/mount.fuse.docfs.8"), encoding: .utf8)
        for name in names + values {
            let inGuide = mentions(guide, name)
            let inPage = mentions(page, name)
            #expect(inGuide, "docs/user-guide/ lacks the mount option \(name)")
            #expect(inPage, "mount.fuse.docfs(8) lacks the mount option \(name)")
        }
    }
}

/// The manual pages, generated from the program as scripts/docs.sh does: with
/// swift-argument-parser's `generate-manual`, the tool its GenerateManual plugin runs, built
/// from the package's own checkout of swift-argument-parser into a folder of its own.
enum ManualPages {
    /// Whether an mdoc page names `option` (`--log-level` is `Fl -log-level`, `-f` is `Fl f`).
    static func names(_ page: String, _ option: String) -> Bool {
        let flag = option.hasPrefix("--") ? "-" + option.dropFirst(2) : String(option.dropFirst())
        return page.range(
            of: "Fl " + NSRegularExpression.escapedPattern(for: flag) + "(?![A-Za-z0-9_-])",
            options: .regularExpression) != nil
    }

    /// Generates the pages of `program` into a folder of the sandbox, and returns it.
    static func generate(program: URL, in sandbox: Sandbox) throws -> URL {
        let tool = try generator(near: program, in: sandbox)
        let folder = URL(fileURLWithPath: sandbox.path("man"))
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let result = try sandbox.execute(
            [tool.path, program.path, "--multi-page", "--output-directory", folder.path])
        try #require(result.status == 0, "generate-manual failed: \(result)")
        return folder
    }

    /// The `generate-manual` tool: built (once; later runs find it built) from the checkout of
    /// swift-argument-parser beside the build that made `program`.
    static func generator(near program: URL, in sandbox: Sandbox) throws -> URL {
        // program: SCRATCH/TRIPLE/debug/docfs
        let scratch = program.resolvingSymlinksInPath().deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let checkout = scratch.appendingPathComponent("checkouts/swift-argument-parser")
        try #require(
            FileManager.default.fileExists(atPath: checkout.appendingPathComponent("Package.swift").path),
            "no checkout of swift-argument-parser at \(checkout.path)")
        let tools = scratch.appendingPathComponent("docs-tools")
        // The real environment: the sandbox's home would hide SwiftPM's caches.
        let result = try sandbox.execute(
            [
                "/usr/bin/env", "timeout", "900", "swift", "build", "--package-path", checkout.path,
                "--scratch-path", tools.path, "--product", "generate-manual",
            ], environment: ["HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/root"])
        try #require(result.status == 0, "building generate-manual failed: \(result)")
        let tool = tools.appendingPathComponent("debug/generate-manual")
        try #require(FileManager.default.isExecutableFile(atPath: tool.path), "no \(tool.path)")
        return tool
    }
}
