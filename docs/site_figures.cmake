# site_figures.cmake: run after Doxygen (-DHTML=<the html folder> -DFIGURES=<docs/figures>
# -DPAGES=<the pages' file names>). First it checks that every page has the name that
# docs/CMakeLists.txt gave it, the one other pages and readers link to.
# The chapter READMEs show their figures as ../../docs/figures/NAME.png (bench/README.md
# and the docs/ pages as ../docs/figures/NAME.png), the path that
# works where they are read on disk; Doxygen keeps such a path as it is. This copies the
# figures into the site and points those images at the copies, so the site stands alone.
foreach(_page ${PAGES})
  if(NOT EXISTS ${HTML}/${_page})
    message(FATAL_ERROR "the documentation site has no page ${_page}: its name is no longer "
                        "the file's place in the repository (DOXYGEN_STRIP_FROM_PATH)")
  endif()
endforeach()
file(GLOB _figures ${FIGURES}/*.png)
file(COPY ${_figures} DESTINATION ${HTML})
file(GLOB _pages ${HTML}/*.html)
foreach(_page ${_pages})
  file(READ ${_page} _text)
  string(FIND "${_text}" "docs/figures/" _at)
  if(NOT _at EQUAL -1)
    string(REPLACE "src=\"../../docs/figures/" "src=\"" _text "${_text}")
    string(REPLACE "src=\"../docs/figures/" "src=\"" _text "${_text}")
    string(REPLACE "src=\"docs/figures/" "src=\"" _text "${_text}")
    file(WRITE ${_page} "${_text}")
  endif()
endforeach()
