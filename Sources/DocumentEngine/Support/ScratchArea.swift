import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// A hidden folder beside a destination — so on the same file system — in which a new item is
/// built and made durable before it is swapped in: the safe-save of FileWrapper's `.atomic` writes
/// and of Document (W-2, UD-24, LX-1, LX-2). The folder and whatever it holds are removed on
/// deinit, whether or not the item was committed.
final class ScratchArea {
    /// The destination's name.
    let name: String
    /// The destination's parent folder.
    let parentPath: String
    /// The scratch folder's descriptor; build the item as `name` in it.
    let fd: Int32
    private let parentFD: Int32
    private let scratchName: String

    /// The scratch folder's path.
    var path: String { parentPath + "/" + scratchName }
    /// Where to build the item.
    var itemPath: String { path + "/" + name }

    /// Tests set this to run the fallback for file systems without RENAME_EXCHANGE on a real one.
    @TaskLocal static var simulatedMissingExchange = false

    init(replacing url: URL) throws {
        name = url.lastPathComponent
        try FileName.validate(name)
        parentPath = url.deletingLastPathComponent().path
        do { parentFD = try POSIX.open(parentPath, O_RDONLY | O_DIRECTORY) } catch {
            throw FileWrapperError.writeFailed(path: parentPath, error)
        }
        scratchName = ".docfs-save-\(getpid())-\(UInt64.random(in: 0...UInt64.max) & 0xFFFF_FFFF_FFFF)"
        do {
            try POSIX.mkdirat(parentFD, scratchName, 0o700)
        } catch {
            POSIX.close(parentFD)
            throw FileWrapperError.writeFailed(path: parentPath + "/" + scratchName, error)
        }
        do { fd = try POSIX.openat(parentFD, scratchName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW) } catch {
            try? POSIX.removeTree(parentFD, scratchName)
            POSIX.close(parentFD)
            throw FileWrapperError.writeFailed(path: parentPath + "/" + scratchName, error)
        }
    }

    deinit {
        POSIX.close(fd)
        try? POSIX.removeTree(parentFD, scratchName)
        POSIX.close(parentFD)
    }

    /// Swaps the built item into place and makes the swap durable.
    func commit() throws -> FileWrapper.Replacement {
        do {
            try POSIX.fsync(fd)
            let replacement = try swapIntoPlace()
            try POSIX.fsync(parentFD)
            return replacement
        } catch {
            throw FileWrapperError.writeFailed(path: parentPath + "/" + name, error)
        }
    }

    /// Puts `scratch/name` at `parent/name`, atomically where the file system allows (LX-1).
    private func swapIntoPlace() throws(Errno) -> FileWrapper.Replacement {
        let exchangeError: Errno
        do throws(Errno) {
            if Self.simulatedMissingExchange { throw Errno.invalidArgument }
            try POSIX.renameat2(fd, name, parentFD, name, flags: POSIX.renameExchange)
            return .exchanged  // the old item is now in the scratch folder, removed with it
        } catch {
            exchangeError = error
        }
        if exchangeError == .noSuchFileOrDirectory {
            do {
                try POSIX.renameat2(fd, name, parentFD, name, flags: POSIX.renameNoReplace)
            } catch {
                guard error == .invalidArgument else { throw error }
                try POSIX.renameat(fd, name, parentFD, name)
            }
            return .renamed
        }
        guard [.invalidArgument, .noFunction, .notSupported].contains(exchangeError) else {
            throw exchangeError
        }
        // No RENAME_EXCHANGE on this file system. rename(2) still replaces a non-directory
        // atomically; a directory can only be moved aside first.
        let newIsDirectory = ((try? POSIX.fstatat(fd, name))?.st_mode ?? 0) & S_IFMT == S_IFDIR
        guard let old = try? POSIX.fstatat(parentFD, name) else {
            try POSIX.renameat(fd, name, parentFD, name)
            return .renamed
        }
        if !newIsDirectory && (old.st_mode & S_IFMT) != S_IFDIR {
            try POSIX.renameat(fd, name, parentFD, name)
            return .exchanged
        }
        let aside = name + ".old"
        try POSIX.renameat(parentFD, name, fd, aside)
        do throws(Errno) { try POSIX.renameat(fd, name, parentFD, name) } catch {
            try? POSIX.renameat(fd, aside, parentFD, name)
            throw error
        }
        return .movedAside
    }
}
