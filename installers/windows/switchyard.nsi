; NSIS 3 script: a per-user installer for the Windows one-folder bundle (dist\switchyard\), built on Linux
; with Debian's `nsis` or on Windows with makensis:
;
;   makensis -DVERSION=0.1.0 -DBUNDLE=dist/switchyard -DOUTFILE=dist/switchyard-0.1.0-setup.exe \
;       installers/windows/switchyard.nsi
;
; (installers/windows/build-nsis.sh does the Windows bundle under wine and this, on Linux.)
; Installs into %LOCALAPPDATA%\Programs\Switchyard with no UAC prompt, adds a Start-menu entry and an
; entry in Apps & features; the uninstaller stops a running Switchyard (its lanes die with it: they live
; in its Job Objects), removes the program and its entries, and keeps models and settings in
; %LOCALAPPDATA%\Switchyard (docs/install.md says how to remove those). A 64-bit installer: the bundle is
; 64-bit, and a 32-bit one would need 32-bit Windows support that some machines (and wine prefixes) lack.

Unicode true
Target amd64-unicode

!ifndef VERSION
  !define VERSION "0.0.0"
!endif
!ifndef BUNDLE
  !define BUNDLE "..\..\dist\switchyard"
!endif
!ifndef OUTFILE
  !define OUTFILE "..\..\dist\switchyard-${VERSION}-setup.exe"
!endif
!ifndef ICON
  !define ICON "..\..\resources\icons\switchyard.ico"
!endif
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\Switchyard"

Name "Switchyard ${VERSION}"
OutFile "${OUTFILE}"
Icon "${ICON}"
UninstallIcon "${ICON}"
RequestExecutionLevel user
InstallDir "$LOCALAPPDATA\Programs\Switchyard"
InstallDirRegKey HKCU "Software\Switchyard" "InstallDir"
!ifndef COMPRESSOR
  !define COMPRESSOR "lzma"  ; the smallest download; the tests pass zlib, several times faster to build
!endif
SetCompressor /SOLID ${COMPRESSOR}
ShowInstDetails nevershow
ShowUninstDetails nevershow

Page directory
Page instfiles
UninstPage uninstConfirm
UninstPage instfiles

; ask a running Switchyard to quit, then end what is left with its process tree (/T)
!macro StopSwitchyard
  nsExec::Exec '"$SYSDIR\taskkill.exe" /IM switchyardw.exe /T'
  Pop $0
  nsExec::Exec '"$SYSDIR\taskkill.exe" /IM switchyard.exe /T'
  Pop $0
  Sleep 2000
  nsExec::Exec '"$SYSDIR\taskkill.exe" /F /IM switchyardw.exe /T'
  Pop $0
  nsExec::Exec '"$SYSDIR\taskkill.exe" /F /IM switchyard.exe /T'
  Pop $0
!macroend

Section "Switchyard"
  SetShellVarContext current
  !insertmacro StopSwitchyard
  ; an update replaces the whole folder: files a newer bundle dropped must not linger
  RMDir /r "$INSTDIR\_internal"
  SetOutPath "$INSTDIR"
  File /r "${BUNDLE}\*.*"
  WriteUninstaller "$INSTDIR\uninstall.exe"
  WriteRegStr HKCU "Software\Switchyard" "InstallDir" "$INSTDIR"
  CreateDirectory "$SMPROGRAMS\Switchyard"
  CreateShortcut "$SMPROGRAMS\Switchyard\Switchyard.lnk" "$INSTDIR\switchyardw.exe" "gui" "$INSTDIR\switchyardw.exe" 0
  CreateShortcut "$SMPROGRAMS\Switchyard\Uninstall Switchyard.lnk" "$INSTDIR\uninstall.exe"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayName" "Switchyard"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINST_KEY}" "Publisher" "Switchyard developers"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayIcon" "$INSTDIR\switchyardw.exe"
  WriteRegStr HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
SectionEnd

Section "Uninstall"
  SetShellVarContext current
  !insertmacro StopSwitchyard
  ; the sign-in entry the window's "start at login" setting may have made (app/ui/autostart.py)
  DeleteRegValue HKCU "Software\Microsoft\Windows\CurrentVersion\Run" "Switchyard"
  Delete "$SMSTARTUP\Switchyard.lnk"
  Delete "$SMPROGRAMS\Switchyard\Switchyard.lnk"
  Delete "$SMPROGRAMS\Switchyard\Uninstall Switchyard.lnk"
  RMDir "$SMPROGRAMS\Switchyard"
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\switchyard.exe"
  Delete "$INSTDIR\switchyardw.exe"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"
  DeleteRegKey HKCU "${UNINST_KEY}"
  DeleteRegKey HKCU "Software\Switchyard"
SectionEnd
