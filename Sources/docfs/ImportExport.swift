import ArgumentParser
import DocumentEngine
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs import [STORE] PATH [--name NAME]`
struct Import: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import a file or folder as a new document.",
        usage: "docfs import [STORE] PATH [--name NAME]",
        discussion: """
            A folder becomes a package document, a regular file a flat document. Permissions, \
            owners, times, `user.` extended attributes and symbolic links (never followed) are \
            kept. Shows a progress bar when standard error is a terminal.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then the PATH of the file or folder (see USAGE).", valueName: "store-and-path"
        ))
    var arguments: [String] = []

    @Option(help: "The document's name (default: the last component of PATH).")
    var name: String?

    func validate() throws {
        _ = try Positionals.split(arguments, needs: ["PATH"])
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, rest) = try Positionals.split(arguments, needs: ["PATH"])
        let store = try StoreLocation(storeArgument).open(logger: logger)
        let url = URL(fileURLWithPath: rest[0])
        let bar = TerminalProgressBar(title: "Importing")
        let info: DocumentInfo
        do {
            info = try store.importItem(at: url, as: name, progress: bar.handler)
            bar.finish()
        } catch {
            // End the bar's line so that the error message starts a line of its own.
            if bar.isEnabled { bar.finish() }
            throw error
        }
        let records = try store.nodes(of: info.id)
        let bytes = records.reduce(Int64(0)) { $0 + ($1.kind == .regularFile ? $1.size : 0) }
        print(
            "imported \(url.path) as \(info.name) (\(info.kind == .package ? "package" : "flat"), "
                + "\(Format.count(records.count, "wrapper")), \(bytes) bytes, version \(info.currentVersion.rawValue))"
        )
        collectGarbageInBackground(store, logger: logger)
    }
}

/// `docfs export [STORE] DOCUMENT DEST [--at VERSION] [--force]`
struct Export: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Export a document to a file or folder.",
        usage: "docfs export [STORE] DOCUMENT DEST [--at VERSION] [--force]",
        discussion: """
            A package document becomes a folder, a flat one a file, with the stored permissions, \
            times, `user.` extended attributes and links. When DEST is an existing folder the \
            document is written into it under its own name. An existing item is replaced only \
            with --force, and then atomically. Shows a progress bar when standard error is a \
            terminal.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, the DOCUMENT, and the DEST path (see USAGE).",
            valueName: "store-document-dest"))
    var arguments: [String] = []

    // Not `--version`: every command already has that flag (it prints docfs's version).
    @Option(
        name: .customLong("at"),
        help: ArgumentHelp("The version to export (default: the current one).", valueName: "version"))
    var version: VersionArgument?

    @Flag(name: .shortAndLong, help: "Replace an existing item at the destination.")
    var force = false

    func validate() throws {
        _ = try Positionals.split(arguments, needs: ["DOCUMENT", "DEST"])
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, rest) = try Positionals.split(arguments, needs: ["DOCUMENT", "DEST"])
        let store = try StoreLocation(storeArgument).open(logger: logger)
        let info = try liveDocument(named: rest[0], in: store)
        if let version = version?.id, try !store.versions(of: info.id).contains(where: { $0.id == version }) {
            throw DocumentStoreError.noSuchVersion(version)
        }
        var destination = URL(fileURLWithPath: rest[1])
        var st = stat()
        // Into an existing folder, as cp does; `lstat` so that a link to a folder is not entered.
        if lstat(destination.path, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR {
            // Only a damaged or hostile store has a document name such as "../x": never a path.
            if let reason = FileName.problem(with: info.name) {
                throw DocumentStoreError.invalidName(info.name, reason: reason)
            }
            destination.appendPathComponent(info.name)
        }
        if lstat(destination.path, &st) == 0, !force {
            throw Failure("\(destination.path) already exists; --force replaces it")
        }
        let bar = TerminalProgressBar(title: "Exporting")
        do {
            try store.exportDocument(
                info.id, at: version?.id, to: destination, progress: bar.handler)
            bar.finish()
        } catch {
            if bar.isEnabled { bar.finish() }
            throw error
        }
        print(
            "exported \(info.name) (version \((version?.id ?? info.currentVersion).rawValue)) to \(destination.path)"
        )
    }
}
